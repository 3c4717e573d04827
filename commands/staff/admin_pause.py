"""The admin's pause and resume of connectors: a "Pause…" / "Resume…" button on a connector's page
and the list's actions, each a page that asks (a reason to pause, optional to resume) and, on its
POST, calls ``commands.staff.pausing`` once per connector — which checks the permission (operators and
up), writes the audit row and refuses a connector paused already (or not paused). The list and
the page show whether each connector sends, is paused (by whom, why, since) or held by an outage.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from commands.models import Connector
from commands.staff import pausing
from commands.staff.actions import MAX_REASON, Refused
from commands.staff.explain import stamp

MAX_AT_ONCE = 1000  # connectors one page acts on


class ReasonForm(forms.Form):
    reason = forms.CharField(
        max_length=MAX_REASON,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text="Why (kept in the audit log).",
    )


class OptionalReasonForm(ReasonForm):
    reason = forms.CharField(
        required=False, max_length=MAX_REASON, widget=forms.Textarea(attrs={"rows": 2, "cols": 80})
    )


def sending_words(connector: Connector) -> str:
    if connector.paused_at is not None:
        who = connector.paused_by.get_username() if connector.paused_by else "someone"
        return f"paused by {who} since {stamp(connector.paused_at)}: {connector.pause_reason}"
    if connector.held_since is not None:
        probe = f"; next probe {stamp(connector.probe_at)}" if connector.probe_at else ""
        return f"held since {stamp(connector.held_since)}: the receiver failed {connector.outage_failures} sends in a row{probe}"
    if not connector.enabled:  # the connector list's only word for it (no column of its own)
        return "disabled: its commands wait as after-fix"
    return "sending"


class PauseActions:
    """Mixed into the connector admin."""

    actions = ["pause_selected", "resume_selected"]

    def has_pause_permission(self, request) -> bool:
        return request.user.has_perm(pausing.PERMISSION)

    @admin.display(description="sending")
    def sending(self, connector: Connector):
        words = sending_words(connector)
        tone = (
            "wait"
            if connector.held_since
            else "person"
            if connector.paused_at or not connector.enabled
            else "none"
        )
        return format_html('<span class="ankusa-badge ankusa-tone-{}" title="{}">{}</span>', tone, words,
                           words.split(":")[0].split(" since")[0])  # fmt: skip

    @admin.action(description="Pause the selected connectors…", permissions=["pause"])
    def pause_selected(self, request, queryset):
        ids = ",".join(str(pk) for pk in queryset.values_list("pk", flat=True)[:MAX_AT_ONCE])
        return HttpResponseRedirect(reverse("admin:commands_connector_pause") + f"?ids={ids}")

    @admin.action(description="Resume the selected connectors…", permissions=["pause"])
    def resume_selected(self, request, queryset):
        ids = ",".join(str(pk) for pk in queryset.values_list("pk", flat=True)[:MAX_AT_ONCE])
        return HttpResponseRedirect(reverse("admin:commands_connector_resume") + f"?ids={ids}")

    def get_urls(self):
        return [
            path("pause/", self.admin_site.admin_view(self.pause_view), name="commands_connector_pause"),
            path("resume/", self.admin_site.admin_view(self.resume_view), name="commands_connector_resume"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = dict(extra_context or {})
        connector = Connector.objects.filter(pk=object_id).first() if str(object_id).isdigit() else None
        if connector is not None and self.has_pause_permission(request):
            verb = "resume" if connector.paused_at else "pause"
            extra[f"{verb}_url"] = reverse(f"admin:commands_connector_{verb}") + f"?ids={connector.pk}"
        return super().change_view(request, object_id, form_url, extra_context=extra)

    def pause_view(self, request):
        return self._act(request, "pause", pausing.pause, ReasonForm)

    def resume_view(self, request):
        return self._act(request, "resume", pausing.resume, OptionalReasonForm)

    def _act(self, request, verb: str, act, form_class):
        if not self.has_pause_permission(request):
            raise PermissionDenied
        raw = (request.POST.get("ids") or request.GET.get("ids") or "").split(",")
        ids = [int(part) for part in raw if part.isdigit() and len(part) < 19][:MAX_AT_ONCE]
        connectors = list(Connector.objects.filter(pk__in=ids).select_related("tenant", "paused_by"))
        changelist = reverse("admin:commands_connector_changelist")
        if not connectors:
            self.message_user(request, "No connector chosen.", messages.WARNING)
            return HttpResponseRedirect(changelist)
        form = form_class(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            done, refused = [], []
            for connector in connectors:
                try:
                    act(connector, user=request.user, via="admin", reason=form.cleaned_data["reason"])
                    done.append(str(connector))
                except Refused as exc:
                    refused.append(exc.detail)
            if done:
                self.message_user(request, f"{verb.capitalize()}d: {', '.join(done)}.", messages.SUCCESS)
            for detail in refused:
                self.message_user(request, detail, messages.WARNING)
            if len(connectors) == 1:
                return HttpResponseRedirect(
                    reverse("admin:commands_connector_change", args=[connectors[0].pk])
                )
            return HttpResponseRedirect(changelist)
        for connector in connectors:
            connector.sending_words = sending_words(connector)
        plan = (
            f"{len(connectors)} connector(s) will be paused: nothing is sent to them and no attempt is "
            "spent until they are resumed; their commands say they wait for the pause."
            if verb == "pause"
            else f"{len(connectors)} connector(s) will be resumed: their waiting commands go at the "
            "resend rate (ANKUSA_RESEND_PER_S)."
        )
        context = {
            **self.admin_site.each_context(request),
            "title": f"{verb.capitalize()} connectors",
            "opts": self.opts,
            "connectors": connectors,
            "form": form,
            "verb": verb,
            "plan": plan,
            "changelist": changelist,
        }
        return TemplateResponse(request, "admin/commands/pause_connector.html", context)
