"""Admin for connectors, sources, commands, attempts and the staff audit log — never leaking secrets.

A connector's credential is write-only: the form never renders it, an empty field keeps the one
stored, and lists show only "set" / "not set"; someone who may only view does not get the field at
all (Django would print a read-only field's value). A source's signing secrets likewise: a new one
is added to the front of the list, old ones are removed by ticking them (each shown only by
position and a fingerprint keyed with the site's secret key), and the verifier is checked when
saved. Deliveries and attempts are history.

Commands: a state changes only through ``commands.actions`` (approve, resend, cancel, make a new
command — ``admin_actions``), never through the form. The failed-command list (``FailedCommand``)
says why each command waits and what to do (``admin_lists``); both command lists search through
``commands.search``. A command's page offers the actions its dry run says can do something, each a
button that posts its id to the command list's own action (so the same confirmation page, with
the dry run, comes first), and shows its attempts across resend copies newest first, its payload,
the connector to fix and the audit rows touching it. The connector list shows each connector at a
glance (``commands.connector_glance``). The audit list is read-only; commands are never deleted.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from ankusa_site.core.admin import GuardedChangeList, ModelAdmin, parse_id
from commands import actions, adapters, connector_glance, search
from commands.admin_actions import CommandActions
from commands.admin_lists import (
    AgeFilter,
    AuditEntryFilter,
    CappedPaginator,
    ConnectorFilter,
    ErrorClassFilter,
    SkipReasonFilter,
    age,
    next_check,
    pretty_json,
    reason_badge,
    short_error,
)
from commands.explain import SKIP_REASONS, URGENCY, explain, urgency, waiting_for
from commands.models import (
    OWN_CONNECTORS_ONLY,
    Attempt,
    AuditEntry,
    Command,
    Connector,
    Delivery,
    FailedCommand,
    Source,
)
from commands.states import State

SECRET_FIELDS = ["secret", "clear_secret"]


def without_secrets(model_admin, request, obj, fieldsets, secret_fields):
    """The fieldsets minus the write-only fields for someone who may only view: Django shows a
    read-only field's stored value, and a credential is never shown back, to anyone."""
    if model_admin.has_change_permission(request, obj) or (
        obj is None and model_admin.has_add_permission(request)
    ):
        return fieldsets
    return [
        (name, {**options, "fields": [f for f in options["fields"] if f not in secret_fields]})
        for name, options in fieldsets
    ]


class ConnectorChangeList(GuardedChangeList):
    """The connector list, with each page's recent success rates read in one query."""

    def get_results(self, request):
        super().get_results(request)
        rates = connector_glance.success_rates([c.pk for c in self.result_list], timezone.now())
        for connector in self.result_list:
            connector.recent = rates.get(connector.pk)


class DeletableWhileUnused:
    """No delete button for a row its history still points at (commands and deliveries protect
    their connector and source): Django's delete page would list every protecting row, then refuse.
    The bulk delete stays, for unused rows; it refuses used ones the same way."""

    protected_by: tuple[str, ...] = ()

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and any(getattr(obj, name).exists() for name in self.protected_by):
            return False
        return super().has_delete_permission(request, obj)


def failed_list_url(**filters) -> str:
    return reverse("admin:commands_failedcommand_changelist") + "?" + urlencode(filters)


class ConnectorGlance:
    """The connector list's columns and the same figures on its page (``commands.connector_glance``)."""

    @admin.display(description="URL")
    def short_url(self, connector: Connector) -> str:
        return Truncator(connector.url).chars(48) or "-"

    @admin.display(description="success, 24 h")
    def success_rate(self, connector: Connector) -> str:
        rate = getattr(connector, "recent", None)
        return rate.text() if rate else "-"

    @admin.display(description="failing", ordering="failing")
    def failing_link(self, connector: Connector):
        return format_html(
            '<a href="{}">{}</a>',
            failed_list_url(connector__id__exact=connector.pk),
            connector_glance.capped(connector.failing),
        )

    @admin.display(description="waiting to go", ordering="waiting")
    def waiting_link(self, connector: Connector):
        url = (
            reverse("admin:commands_command_changelist")
            + "?"
            + urlencode(
                {"connector__id__exact": connector.pk, "state__in": ",".join(connector_glance.WAITING_STATES)}
            )
        )
        return format_html('<a href="{}">{}</a>', url, connector_glance.capped(connector.waiting))

    @admin.display(description="last error", ordering="last_failed_at")
    def last_error_link(self, connector: Connector):
        if connector.last_failed_at is None:
            return "-"
        return format_html(
            '<a href="{}"><code>{}</code> {}</a> <span class="ankusa-when">{}</span>',
            failed_list_url(
                connector__id__exact=connector.pk, last_error_class=connector.last_error_class or ""
            ),
            connector.last_error_class or "?",
            Truncator(connector.last_error or "").chars(60),
            moment(connector.last_failed_at),
        )

    @admin.display(description="at a glance")
    def glance(self, connector: Connector):
        if connector.pk is None:
            return "-"
        connector = connector_glance.annotate(Connector.objects.filter(pk=connector.pk)).get()
        connector.recent = connector_glance.success_rates([connector.pk], timezone.now()).get(connector.pk)
        return format_html(
            '<table class="ankusa-glance"><tr><th>success, 24 h</th><td>{}</td></tr>'
            "<tr><th>failing</th><td>{}</td></tr><tr><th>waiting to go</th><td>{}</td></tr>"
            "<tr><th>last error</th><td>{}</td></tr></table>",
            self.success_rate(connector),
            self.failing_link(connector),
            self.waiting_link(connector),
            self.last_error_link(connector),
        )


class ConnectorForm(forms.ModelForm):
    secret = forms.CharField(
        required=False,
        strip=False,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Leave empty to keep the stored value.",
    )
    clear_secret = forms.BooleanField(required=False, label="Remove the stored secret")

    class Meta:
        model = Connector
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("clear_secret"):
            cleaned["secret"] = ""
        elif not cleaned.get("secret"):
            cleaned["secret"] = self.instance.secret
        return cleaned


@admin.register(Connector)
class ConnectorAdmin(DeletableWhileUnused, ConnectorGlance, ModelAdmin):
    """Connectors, each with how it has been doing (``connector_glance``): a few annotations and one
    query per page, whatever the number of commands."""

    form = ConnectorForm
    protected_by = ("commands",)
    list_display = [
        "name",
        "tenant",
        "short_url",
        "enabled",
        "idempotent",
        "secret_set",
        "success_rate",
        "failing_link",
        "waiting_link",
        "last_error_link",
    ]
    list_filter = ["kind", "enabled", "idempotent"]
    list_select_related = ["tenant"]
    search_fields = ["name", "url", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    readonly_fields = ["secret_set", "problems", "glance", "updated_at"]
    fieldsets = [
        (None, {"fields": ["tenant", "name", "kind", "enabled", "idempotent", "problems", "glance"]}),
        (
            "HTTP",
            {"fields": ["url", "method", "headers", "connect_timeout_s", "read_timeout_s", "status_map"]},
        ),
        ("Credential", {"fields": ["secret_header", "secret_set", "secret", "clear_secret"]}),
        ("Pacing, per dispatch process", {"fields": ["max_in_flight", "max_per_s"]}),
        (None, {"fields": ["updated_at"]}),
    ]

    def get_fieldsets(self, request, obj=None):
        return without_secrets(self, request, obj, super().get_fieldsets(request, obj), SECRET_FIELDS)

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), *(["tenant"] if obj else [])]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        # What the save did to its waiting commands (Connector.save decided again on them).
        reconsidered = getattr(obj, "reconsidered", None)
        if reconsidered is not None and (reconsidered.going or reconsidered.parked):
            self.message_user(request, reconsidered.summary(), messages.INFO)

    def get_queryset(self, request):
        return connector_glance.annotate(super().get_queryset(request))

    def get_changelist(self, request, **kwargs):
        return ConnectorChangeList

    @admin.display(description="stored secret")
    def secret_set(self, obj: Connector) -> str:
        return "set" if obj.secret else "not set"

    @admin.display(description="problems")
    def problems(self, obj: Connector) -> str:
        if obj.pk is None:
            return "-"
        return "; ".join(adapters.problems(obj)) or "none"


def secret_label(index: int, secret: str) -> str:
    """How staff tell the secrets of a list apart without seeing them: position and a keyed hash."""
    digest = hmac.new(settings.SECRET_KEY.encode(), secret.encode(), hashlib.sha256).hexdigest()[:8]
    return f"#{index + 1}{' (newest)' if index == 0 else ''} · fingerprint {digest}"


class ByVerifierSelect(forms.NullBooleanSelect):
    """Yes / No, and for a new source the default named for what it is."""

    def __init__(self, attrs=None):
        super().__init__(attrs)
        self.choices = [
            ("unknown", "By verifier: on for GitHub and Shopify"),
            ("true", "Yes"),
            ("false", "No"),
        ]


class SourceForm(forms.ModelForm):
    # Write-only: the form never renders a stored secret. A new one goes first (newest); ticked
    # ones are removed — rotation is "add the new one, remove the old once the provider uses it".
    verifier_secrets = forms.CharField(
        required=False,
        label="Add a secret",
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only. Becomes the newest of the list; leave empty to keep the list as it is.",
    )
    remove_secrets = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Remove secrets"
    )

    class Meta:
        model = Source
        fields = "__all__"
        widgets = {"dedupe_body": ByVerifierSelect}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stored = self.instance.verifier_secrets or []
        self.fields["remove_secrets"].choices = [(str(i), secret_label(i, s)) for i, s in enumerate(stored)]

    def clean(self):
        cleaned = super().clean()
        # On change the tenant is read-only (not in the form): the stored one.
        tenant_id = cleaned["tenant"].pk if cleaned.get("tenant") else self.instance.tenant_id
        connectors = cleaned.get("connectors")
        if tenant_id and connectors and any(c.tenant_id != tenant_id for c in connectors):
            raise forms.ValidationError(OWN_CONNECTORS_ONLY)
        removed = set(cleaned.get("remove_secrets") or [])
        kept = [s for i, s in enumerate(self.instance.verifier_secrets or []) if str(i) not in removed]
        added = cleaned.get("verifier_secrets")
        cleaned["verifier_secrets"] = ([added] if added else []) + kept
        return cleaned


@admin.register(Source)
class SourceAdmin(DeletableWhileUnused, ModelAdmin):
    form = SourceForm
    protected_by = ("commands", "deliveries")
    list_display = ["slug", "tenant", "verifier", "secrets_set", "dedupe_key", "needs_approval"]
    list_filter = ["verifier", "needs_approval"]
    list_select_related = ["tenant"]
    search_fields = ["slug", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    filter_horizontal = ["connectors"]

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if db_field.name == "connectors":  # each is named tenant/name: one query, not one per connector
            kwargs["queryset"] = Connector.objects.select_related("tenant")
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    readonly_fields = ["secrets_set", "hook_url"]
    fieldsets = [
        (None, {"fields": ["tenant", "slug", "hook_url", "connectors", "needs_approval"]}),
        (
            "Signature",
            {"fields": ["verifier", "secrets_set", "verifier_secrets", "remove_secrets", "verifier_options"]},
        ),
        ("Dedupe", {"fields": ["dedupe_key", "dedupe_body"]}),
    ]

    def get_fieldsets(self, request, obj=None):
        return without_secrets(
            self, request, obj, super().get_fieldsets(request, obj), ["verifier_secrets", "remove_secrets"]
        )

    def get_readonly_fields(self, request, obj=None):
        return [*super().get_readonly_fields(request, obj), *(["tenant"] if obj else [])]

    @admin.display(description="secrets")
    def secrets_set(self, obj: Source) -> str:
        count = len(obj.verifier_secrets or [])
        return f"{count} set" if count else "not set"

    @admin.display(description="webhook URL")
    def hook_url(self, obj: Source) -> str:
        if obj.pk is None:
            return "-"
        return reverse("hook", kwargs={"tenant": obj.tenant.slug, "source": obj.slug})


class HistoryOnly:
    """Attempts are history: shown, never added, changed or deleted here."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


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


class CommandSearch:
    """The lists' search box: id, idempotency key, connector name, tenant slug, payload text
    (``commands.search``); the admin's own ``search_fields`` too, when ``also_search_fields``."""

    search_help_text = (
        "An id, an idempotency key, a connector's name, a tenant's slug, or text in the payload "
        "(an order number)."
    )
    also_search_fields = False

    def get_search_results(self, request, queryset, search_term):
        if not search.terms(search_term):
            return queryset, False
        found = search.search(queryset, search_term)
        if not self.also_search_fields:
            return found, False
        own, duplicates = super().get_search_results(request, queryset, search_term)
        return found | own, duplicates


COMMAND_COLUMNS = [
    "id",
    "tenant",
    "connector_name",
    "state",
    "why",
    "last_outlook",
    "attempts",
    "next_check",
]


@admin.register(Command)
class CommandAdmin(CommandSearch, CommandDetail, CommandActions, ModelAdmin):
    list_display = [*COMMAND_COLUMNS, "created_at"]
    list_filter = [
        "state",
        SkipReasonFilter,
        "tenant",
        ("connector", ConnectorFilter),
        "last_outlook",
        AuditEntryFilter,
    ]
    list_select_related = ["tenant", "connector"]
    search_fields = ["=id"]  # the box; commands.search does the searching
    raw_id_fields = ["connector", "source", "delivery"]
    autocomplete_fields = ["tenant"]
    show_full_result_count = False
    paginator = CappedPaginator
    actions = ["approve_selected", "resend_selected", "cancel_selected", "new_command_selected"]

    def get_readonly_fields(self, request, obj=None):
        # A new command starts approved (the sweep takes it); after that, only the loop moves it.
        if obj is None:
            return STATE_FIELDS
        return ["tenant", "connector", "source", "delivery", "idempotency_key", *DETAIL_FIELDS, *STATE_FIELDS]

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["tenant", "connector", "source", "delivery", "idempotency_key", "payload", *STATE_FIELDS]
        return ["tenant", "connector", "source", "delivery", "idempotency_key", *DETAIL_FIELDS, *STATE_FIELDS]

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a command leaves by cancel (audited); its attempts would block a delete anyway

    @admin.display(description="connector", ordering="connector__name")
    def connector_name(self, command: Command) -> str:
        return command.connector.name  # the tenant has its own column


@admin.register(FailedCommand)
class FailedCommandAdmin(CommandSearch, CommandDetail, CommandActions, ModelAdmin):
    """The failed-command list: why each waits and what to do, cheap on 100,000+ rows.

    Ordered by the partial index ``commands_failed_idx`` (skip_reason, -id) WHERE state = failed, so
    the first page (and each skip-reason filter) is an index range scan; the count is capped
    (``CappedPaginator``); every column reads the row and its tenant and connector (one join).
    """

    # No state column: every row is failed (a 1280 px screen has no width to spare).
    list_display = [
        "id",
        "tenant",
        "connector_column",
        "why_first",
        "last_outlook",
        "attempts",
        "next_check",
        "error",
        "age",
    ]
    list_filter = [
        SkipReasonFilter,
        "tenant",
        ("connector", ConnectorFilter),
        "last_outlook",
        ErrorClassFilter,
        AgeFilter,
        AuditEntryFilter,
    ]
    list_select_related = ["tenant", "connector"]
    search_fields = ["=id", "=idempotency_key", "last_error", "last_error_class"]
    also_search_fields = True  # the error text, besides commands.search
    show_full_result_count = False
    paginator = CappedPaginator
    list_per_page = 100
    actions = ["resend_selected", "cancel_selected", "new_command_selected"]
    fields = ["tenant", "connector", "source", "delivery", "idempotency_key", *DETAIL_FIELDS, *STATE_FIELDS]
    readonly_fields = fields

    def get_queryset(self, request):
        # Annotated before the admin orders by it (ModelAdmin.get_queryset orders at once).
        failed = self.model._default_manager.filter(state=State.FAILED).annotate(urgency=urgency())
        return failed.order_by(*self.get_ordering(request))

    def get_ordering(self, request):
        # What needs a person first, then oldest first (``explain.URGENCY``, served by the index
        # commands_failed_urgency_idx); the header says so. Not ``ordering``: it names fields only.
        # Within one reason (its filter) all share a rank: oldest first, backwards along
        # commands_failed_idx (skip_reason, -id), which serves that filter.
        if request.GET.get(SkipReasonFilter.parameter_name):
            return ["-skip_reason", "id"]
        return ["urgency", "id"]

    def get_changelist(self, request, **kwargs):
        # Django marks the header's sorted columns by the ``ordering`` attribute alone: this one's.
        ordering = self.get_ordering(request)
        base = super().get_changelist(request, **kwargs)
        return type("FailedChangeList", (base,), {"_get_default_ordering": lambda changelist: ordering})

    def changelist_view(self, request, extra_context=None):
        # The order, said above the list (its template) when it is the default one.
        order = [] if request.GET.get(SkipReasonFilter.parameter_name) else URGENCY
        return super().changelist_view(request, {"urgency_order": order, **(extra_context or {})})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        # A command that left the failed list (it succeeded, say) is shown where every command is,
        # not as "doesn't exist": a link to it from this list may be older than its last send.
        pk = parse_id(object_id)
        if pk is not None and not self.get_queryset(request).filter(pk=pk).exists():
            command = Command.objects.filter(pk=pk).only("state").first()
            if command is not None:
                self.message_user(
                    request, f"Command {pk} is not failed any more ({command.state}).", messages.INFO
                )
                return HttpResponseRedirect(reverse("admin:commands_command_change", args=[pk]))
        return super().change_view(request, object_id, form_url, extra_context)

    @admin.display(description="why it waits", ordering="urgency")
    def why_first(self, command: Command):
        return reason_badge(command)

    def has_add_permission(self, request) -> bool:
        return False  # commands come from intake, the API or the command list

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # a view: its commands change only through the actions

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="connector", ordering="connector__name")
    def connector_column(self, command: Command):
        # Linked to its page: the fix for an after-fix command is made there.
        return format_html(
            '<a href="{}">{}</a>',
            reverse("admin:commands_connector_change", args=[command.connector_id]),
            command.connector.name,
        )

    @admin.display(description="last error")
    def error(self, command: Command):
        return short_error(command)


# An audit entry links each of its commands only up to this many; beyond, the count and a link to
# the command list filtered by the entry (a bulk resend may touch 100,000 commands).
AUDIT_LINKED = 50


@admin.register(AuditEntry)
class AuditEntryAdmin(HistoryOnly, ModelAdmin):
    """What staff did, read-only: written by ``commands.actions``, never edited or deleted here."""

    list_display = [
        "at",
        "username",
        "action",
        "via",
        "short_reason",
        "count",
        "done",
        "outcome",
        "commands_link",
    ]
    list_filter = ["action", "via", ("user", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["username", "reason"]
    date_hierarchy = "at"
    show_full_result_count = False
    fields = ["at", "username", "user", "action", "via", "reason", "count", "done", "outcome", "command_list"]
    readonly_fields = fields

    @admin.display(description="reason")
    def short_reason(self, entry: AuditEntry) -> str:
        return Truncator(entry.reason).chars(80) or "-"

    @admin.display(description="result")
    def outcome(self, entry: AuditEntry) -> str:
        # {"skipped": {"not failed": 2}} reads "skipped: 2 not failed"; other keys as they are.
        parts = []
        for key, value in (entry.result or {}).items():
            if isinstance(value, dict):
                value = ", ".join(f"{n} {reason}" for reason, n in value.items()) or "none"
            parts.append(f"{key}: {value}")
        return "; ".join(parts) or "-"

    @admin.display(description="commands")
    def commands_link(self, entry: AuditEntry):
        # The entry links the commands it changed (``done``); ``count`` is how many were asked for.
        url = reverse("admin:commands_command_changelist") + f"?audit={entry.pk}"
        return format_html('<a href="{}">{} changed</a> of {} asked', url, entry.done, entry.count)

    @admin.display(description="commands")
    def command_list(self, entry: AuditEntry):
        ids = list(entry.commands.order_by("id").values_list("id", flat=True)[: AUDIT_LINKED + 1])
        links = format_html_join(
            ", ",
            '<a href="{}">{}</a>',
            [(reverse("admin:commands_command_change", args=[pk]), pk) for pk in ids[:AUDIT_LINKED]],
        )
        url = reverse("admin:commands_command_changelist") + f"?audit={entry.pk}"
        more = f" and more: {entry.done} in all" if len(ids) > AUDIT_LINKED else ""
        return format_html('{}{} — <a href="{}">list them</a>', links or "none", more, url)


@admin.register(Attempt)
class AttemptAdmin(HistoryOnly, ModelAdmin):
    list_display = ["command", *ATTEMPT_COLUMNS]
    ordering = ["-id"]  # newest first
    list_filter = ["ok", "outlook"]
    list_select_related = ["command"]
    raw_id_fields = ["command"]
    show_full_result_count = False


class DeliveryCommandInline(HistoryOnly, admin.TabularInline):
    model = Command
    fields = ["id", "connector", "state", "skip_reason", "attempts"]
    readonly_fields = fields
    show_change_link = True
    extra = 0


@admin.register(Delivery)
class DeliveryAdmin(HistoryOnly, ModelAdmin):
    list_display = ["id", "tenant", "source", "event_key", "size", "received_at"]
    list_select_related = ["tenant", "source__tenant"]
    # Exact matches only: the unique (event_key, tenant, source) index serves them, a LIKE would not.
    search_fields = ["=event_key", "=id"]
    show_full_result_count = False
    fields = ["tenant", "source", "event_key", "received_at", "size", "headers", "body"]
    readonly_fields = fields
    inlines = [DeliveryCommandInline]
