"""Staff actions on commands in the admin: approve, resend, cancel, make a new command.

Thin, as ``STYLE.md`` asks: each action parses the form, checks the permission and calls one
function of ``commands.staff.actions`` (``plan`` for the dry run, ``perform`` / ``new_command`` to do
it), then reports with ``message_user``. The rules — who may, which command is eligible, the
compare-and-set, the audit row — live there, shared with the REST API.

* **Every action asks first.** Choosing one (on the selection, or on everything the filter matches:
  Django's "select all") shows a page with the count and the dry run's breakdown by eligibility;
  only the POST of that page, with ``confirmed=yes``, changes anything. A GET never does.
* **Resend with an override** (a non-idempotent connector, an unknown outcome) is offered only to
  users holding ``commands.resend_override_command``, and needs a typed reason. A forged POST
  from anyone else is refused by ``perform`` (403), not merely hidden; anyone else is told to ask
  an admin. "Yes" is offered only when something would change; a confirmed act that would change
  nothing (a reason typed, the override not ticked) is refused by ``perform`` with what would help,
  and writes no audit row.
* **Make a new command** works on one failed command at a time: a form with its payload as
  editable JSON; the original is cancelled and linked from the copy.

Pacing is the domain's: a bulk resend gets due times spread at ``ANKUSA_RESEND_PER_S`` with jitter
(``commands.staff.actions.perform``), so the page only says how many and when the first goes.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ankusa_site.core.admin import StorableJSONField, selected_across
from commands.models import Command
from commands.staff import actions
from commands.staff.admin_lists import CappedPaginator
from commands.staff.explain import explain
from commands.states import State


class NewCommandForm(forms.Form):
    # The admin's shared JSON field: the intake's rule for what a database can store, null refused.
    payload = StorableJSONField(
        indent=2,
        widget=forms.Textarea(attrs={"rows": 16, "cols": 80, "class": "vLargeTextField"}),
        help_text="The new command's payload, as JSON. The original keeps its own.",
    )
    reason = forms.CharField(
        required=False,
        max_length=actions.MAX_REASON,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text="Why (kept in the audit log).",
    )


class CommandActions:
    """Mixed into the command admins: the actions, their confirmation pages, the new-command form."""

    # --- permissions: one per action, named as ``@admin.action(permissions=[...])`` expects ---------

    def has_approve_permission(self, request) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["approve"])

    def has_resend_permission(self, request) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["resend"])

    def has_cancel_permission(self, request) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["cancel"])

    def has_new_command_permission(self, request) -> bool:
        return request.user.has_perm(actions.PERMISSIONS["new-command"])

    def has_override_permission(self, request) -> bool:
        return request.user.has_perm(actions.OVERRIDE_PERMISSION)

    # --- the actions ---------------------------------------------------------------------------------

    @admin.action(permissions=["approve"], description="Approve the selected drafts…")
    def approve_selected(self, request, queryset):
        return self._confirm(request, queryset, "approve", "approve_selected")

    @admin.action(permissions=["resend"], description="Resend the selected failed commands…")
    def resend_selected(self, request, queryset):
        return self._confirm(request, queryset, "resend", "resend_selected")

    @admin.action(permissions=["cancel"], description="Cancel the selected commands…")
    def cancel_selected(self, request, queryset):
        return self._confirm(request, queryset, "cancel", "cancel_selected")

    @admin.action(permissions=["new_command"], description="Make a new command from the selected one…")
    def new_command_selected(self, request, queryset):
        ids = list(queryset.values_list("pk", flat=True)[:2])
        if len(ids) != 1:
            self.message_user(
                request,
                "Choose exactly one command: a new command is made from one original at a time.",
                messages.WARNING,
            )
            return None
        return HttpResponseRedirect(reverse(self._url_name("new_command"), args=[ids[0]]))

    def get_actions(self, request):
        found = super().get_actions(request)
        found.pop("delete_selected", None)  # commands leave by cancel, with an audit row, never by delete
        return found

    def _url_name(self, view: str) -> str:
        return f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_{view}"

    def _confirm(self, request, queryset, action: str, name: str):
        override = actions.overridable(action) and request.POST.get("override") == "on"
        reason = request.POST.get("reason", "")  # perform refuses one too long, with the limit
        error = None
        if request.method == "POST" and request.POST.get("confirmed") == "yes":
            try:
                done = actions.perform(
                    action, queryset, user=request.user, via="admin", reason=reason, override=override
                )
            except actions.Refused as exc:
                error = exc.detail
            else:
                level = messages.SUCCESS if done.done else messages.WARNING
                self.message_user(request, done.summary(), level)
                return None
        can_override = actions.overridable(action) and self.has_override_permission(request)
        plan = actions.plan(action, queryset)
        with_override = plan.overridden() if can_override else None
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.capitalize()} commands?",
            "opts": self.opts,
            "action": name,
            "verb": action,
            "done_word": actions.DONE_WORDS[action],
            "plan": plan,
            "need_override": sorted(plan.need_override.items()),
            "cannot": sorted(plan.cannot.items()),
            "with_override": with_override,
            "can_override": can_override and bool(plan.need_override),
            # "Yes" only where it can change something: now, or with the override this user may tick.
            "offer": bool(plan.will) or (can_override and bool(plan.need_override)),
            "capped": plan.total > CappedPaginator.CAP,
            "cap": f"{CappedPaginator.CAP:,}",
            "override": override,
            "reason": reason,
            "error": error,
            # Read as Django's action form reads it, so the page re-posts what the queryset meant.
            "select_across": selected_across(request),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "changelist": reverse(self._url_name("changelist")),
        }
        return TemplateResponse(request, "admin/commands/confirm_action.html", context)

    # --- make a new command: its own page, GET shows, POST does ---------------------------------------

    def get_urls(self):
        view = self.admin_site.admin_view(self.new_command_view)
        return [
            path(
                "<int:object_id>/new-command/",
                view,
                name=f"{self.opts.app_label}_{self.opts.model_name}_new_command",
            ),
            *super().get_urls(),
        ]

    def new_command_view(self, request, object_id: int):
        if not self.has_new_command_permission(request):
            raise PermissionDenied
        original = get_object_or_404(Command.objects.select_related("tenant", "connector"), pk=object_id)
        if request.method == "POST":
            form = NewCommandForm(request.POST)
            if form.is_valid():
                try:
                    copy = actions.new_command(
                        original,
                        user=request.user,
                        via="admin",
                        payload=form.cleaned_data["payload"],
                        reason=form.cleaned_data["reason"],
                    )
                except actions.Refused as exc:
                    form.add_error(None, exc.detail)
                else:
                    self.message_user(
                        request,
                        f"Command {copy.pk} made from command {original.pk}, which is cancelled.",
                        messages.SUCCESS,
                    )
                    return HttpResponseRedirect(reverse("admin:commands_command_change", args=[copy.pk]))
        else:
            form = NewCommandForm(initial={"payload": original.payload})
        context = {
            **self.admin_site.each_context(request),
            "title": f"Make a new command from command {original.pk}",
            "opts": self.opts,
            "original": original,
            "explanation": explain(original),
            "eligible": original.state == State.FAILED,
            "form": form,
            "changelist": reverse(self._url_name("changelist")),
            "original_url": reverse("admin:commands_command_change", args=[original.pk]),
        }
        return TemplateResponse(request, "admin/commands/new_command.html", context)
