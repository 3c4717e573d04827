"""Admin for history: the staff audit log (written by ``commands.staff.actions``), attempts and
deliveries — read-only, never edited or deleted here.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from ankusa_site.core.admin import ModelAdmin
from commands.models import (
    Attempt,
    AuditEntry,
    Command,
    Delivery,
)
from commands.staff.command_page import ATTEMPT_COLUMNS


class HistoryOnly:
    """Attempts are history: shown, never added, changed or deleted here."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


# An audit entry links each of its commands only up to this many; beyond, the count and a link to
# the command list filtered by the entry (a bulk resend may touch 100,000 commands).
AUDIT_LINKED = 50


@admin.register(AuditEntry)
class AuditEntryAdmin(HistoryOnly, ModelAdmin):
    """What staff did, read-only: written by ``commands.staff.actions``, never edited or deleted here."""

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
