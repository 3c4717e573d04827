"""A command's admin page (``CommandDetail``): why it waits, its age, the connector to fix, its
payload, its attempts across resend copies newest first, and the audit rows touching it. The actions
its dry run says can do something are buttons that post its id to the command list's own action
(so the same confirmation page, with the dry run, comes first). No field is editable.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from commands.dispatch import adapters
from commands.models import (
    Attempt,
    Command,
)
from commands.staff import actions
from commands.staff.admin_lists import (
    age,
    next_check,
    pretty_json,
    reason_badge,
)
from commands.staff.explain import SKIP_REASONS, explain, waiting_for
from commands.states import State

ATTEMPT_COLUMNS = ["number", "started_at", "finished_at", "ok", "outlook", "status_code", "error_class"]


STATE_FIELDS = [
    "state",
    "state_changed_at",
    "last_outlook",
    "attempts",
    "skip_decided_at",
    "last_error_class",
    "last_error",
    "approved_by",
    "approved_at",
    "resent_from",
    "created_at",
]


# The detail page's read-only views of a command: why it waits, its payload, where it goes, its
# attempts across resends, and what staff did to it. The stored skip reason and due time are not
# shown beside "why": it says both in words (an after-fix command is stored as backing off).
DETAIL_FIELDS = ["why_in_full", "age", "connector_link", "pretty_payload", "history", "audit"]


# A resend chain longer than this is shown cut: no person makes 50 copies of one instruction.
MAX_CHAIN = 50


AUDIT_SHOWN = 20


# What the attempts table shows of a receiver's answer; the attempt's page has all it kept.
EXCERPT_SHOWN = 160


def resent_by(attempt: Attempt) -> str:
    """Who sent it: the loop, or the person whose resend it was."""
    if not attempt.manual:
        return "the loop"
    return f"resent by {attempt.manual_by.username}" if attempt.manual_by else "resent by a deleted user"


def resend_chain(command: Command) -> list[Command]:
    """The copies made from one another around ``command``: its first original, then every copy made
    from it (breadth-first, oldest first). One query per step; bounded by ``MAX_CHAIN``."""
    root, seen = command, {command.pk}
    while root.resent_from_id is not None and root.resent_from_id not in seen and len(seen) < MAX_CHAIN:
        root = Command.objects.get(pk=root.resent_from_id)
        seen.add(root.pk)
    chain, frontier = [root], [root.pk]
    while frontier and len(chain) < MAX_CHAIN:
        children = list(Command.objects.filter(resent_from__in=frontier).order_by("id")[:MAX_CHAIN])
        children = [child for child in children if child.pk not in {c.pk for c in chain}]
        chain.extend(children)
        frontier = [child.pk for child in children]
    return chain[:MAX_CHAIN]


def moment(value) -> str:
    """A time as staff read it anywhere in the console: to the second, in the site's time zone, named
    (the ``DATETIME_FORMAT`` of ``ankusa_site/formats``)."""
    return date_format(timezone.localtime(value), "DATETIME_FORMAT") if value else "-"


class CommandDetail:
    """The read-only parts of a command's page (both the command and the failed-command admin)."""

    # List columns, shared by both lists (``why`` is one of them, and a field of the page).
    @admin.display(description="next check", ordering="next_attempt_at")
    def next_check(self, command: Command):
        return next_check(command)

    @admin.display(description="why it waits")
    def why(self, command: Command):
        return reason_badge(command) if command.pk else "-"

    @admin.display(description="why it waits")
    def why_in_full(self, command: Command):  # the page's: with what to do
        return reason_badge(command, detail=True) if command.pk else "-"

    @admin.display(description="age")
    def age(self, command: Command) -> str:
        return age(command.created_at)

    @admin.display(description="connector")
    def connector_link(self, command: Command):
        if not command.connector_id:
            return "-"
        connector = command.connector
        notes = []
        if problems := adapters.problems(connector):
            notes.append(f"its configuration: {'; '.join(problems)}")
        # What the receiver said counts too: a 401 is no problem of the stored configuration.
        waiting = Command.objects.filter(waiting_for("after-fix"), connector=connector, state=State.FAILED)
        if count := waiting.count():
            notes.append(f"{count} of its failed commands wait for a configuration fix")
        explanation = explain(command)
        hint = ""
        if explanation.fix_helps:  # only where editing the connector can release this command
            hint = (
                " Edit it to release this command: saving re-decides its waiting commands, and those "
                "released go within the dispatch poll."
            )
        return format_html(
            '<a href="{}">{}</a>{}{}',
            reverse("admin:commands_connector_change", args=[connector.pk]),
            connector,
            f" ({'; '.join(notes)})." if notes else "",
            hint,
        )

    @admin.display(description="payload")
    def pretty_payload(self, command: Command):
        return pretty_json(command.payload)

    @admin.display(description="attempts, across resends")
    def history(self, command: Command):
        if command.pk is None:
            return "-"
        chain = resend_chain(command)
        attempts = {}
        # Newest first, as a person reads a history: the latest copy and its latest attempt on top.
        for attempt in (
            Attempt.objects.filter(command__in=[c.pk for c in chain])
            .select_related("manual_by")
            .order_by("command", "-number")
        ):
            attempts.setdefault(attempt.command_id, []).append(attempt)
        rows = []
        for copy in reversed(chain):
            link = format_html(
                '<a href="{}">command {}</a>{}',
                reverse("admin:commands_command_change", args=[copy.pk]),
                copy.pk,
                " (this one)" if copy.pk == command.pk else "",
            )
            origin = f"copy of {copy.resent_from_id}" if copy.resent_from_id else "original"
            rows.append(
                format_html(
                    '<tr class="ankusa-chain"><th colspan="9">{} — {}, {}, {} attempt(s)</th></tr>',
                    link,
                    origin,
                    copy.state,
                    copy.attempts,
                )
            )
            for a in attempts.get(copy.pk, []):
                outcome = "ok" if a.ok else ("failed" if a.ok is False else "unknown")
                rows.append(
                    format_html(
                        '<tr class="ankusa-attempt"><td><a href="{}">#{}</a></td><td>{}</td><td>{}</td>'
                        "<td>{}</td><td>{}</td><td>{}</td><td><code>{}</code> {}</td>"
                        '<td class="ankusa-excerpt">{}</td><td>{}</td></tr>',
                        reverse("admin:commands_attempt_change", args=[a.pk]),
                        a.number,
                        moment(a.started_at),
                        moment(a.finished_at),
                        outcome,
                        a.outlook or "-",
                        a.status_code or "-",
                        a.error_class or "-",
                        Truncator(a.error_message).chars(200),
                        Truncator(a.response_excerpt).chars(EXCERPT_SHOWN) or "-",
                        resent_by(a),
                    )
                )
        header = format_html(
            "<tr>{}</tr>",
            format_html_join(
                "",
                "<th>{}</th>",
                [
                    (h,)
                    for h in [
                        "#",
                        "started",
                        "finished",
                        "outcome",
                        "outlook",
                        "status",
                        "error",
                        "answer (excerpt)",
                        "sent by",
                    ]
                ],
            ),
        )
        return format_html(
            '<table class="ankusa-history">{}{}</table>',
            header,
            format_html_join("", "{}", [(r,) for r in rows]),
        )

    @admin.display(description="audit log")
    def audit(self, command: Command):
        if command.pk is None:
            return "-"
        entries = list(command.audit_entries.order_by("-at", "-id")[:AUDIT_SHOWN])
        if not entries:
            return "no staff action yet"
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                '<li><a href="{}">{}</a>: {} {}{}</li>',
                [
                    (
                        reverse("admin:commands_auditentry_change", args=[entry.pk]),
                        entry,
                        f"{entry.done} of {entry.count} changed",
                        f"via {entry.via}",
                        f" — {entry.reason}" if entry.reason else "",
                    )
                    for entry in entries
                ],
            ),
        )

    def command_actions(self, request, command: Command) -> list[dict]:
        """The actions this person may take on ``command`` that its dry run says can do something,
        each with that dry run. A button posts the command's id to the command list's own action,
        so it goes through the same confirmation page (with the dry run) as a bulk action."""
        offered = []
        one = Command.objects.filter(pk=command.pk)
        for verb, name, allowed in (
            ("approve", "approve_selected", self.has_approve_permission(request)),
            ("resend", "resend_selected", self.has_resend_permission(request)),
            ("cancel", "cancel_selected", self.has_cancel_permission(request)),
        ):
            if not allowed:
                continue
            dry_run = actions.plan(verb, one)
            possible = dry_run.will or (dry_run.need_override and self.has_override_permission(request))
            if possible:
                offered.append({"verb": verb, "action": name, "plan": dry_run.summary()})
        return offered

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        # Offered only where it can work: a failed command (the page's own row says so).
        if obj is not None and obj.state == State.FAILED and self.has_new_command_permission(request):
            context["new_command_url"] = reverse(self._url_name("new_command"), args=[obj.pk])
        if obj is not None:
            context["command_actions"] = self.command_actions(request, obj)
            # The command list's action, narrowed to this one command: after it, the list shows it.
            context["command_actions_url"] = (
                reverse("admin:commands_command_changelist") + f"?id__exact={obj.pk}"
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def changelist_view(self, request, extra_context=None):
        # The explanation of each reason, once above the list (a row shows its badge, with the
        # explanation as the badge's tooltip).
        legend = [(key, explanation) for key, explanation in SKIP_REASONS.items()]
        return super().changelist_view(request, {**(extra_context or {}), "reason_legend": legend})
