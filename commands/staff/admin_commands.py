"""Admin for commands: the command list and the failed-command list (``FailedCommand``: why each
command waits and what to do, ``admin_lists``), both searched through ``commands.staff.search``.

A state changes only through ``commands.staff.actions`` (approve, resend, cancel, make a new command —
``admin_actions``), never through the form; commands are never deleted.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from ankusa_site.core.admin import ModelAdmin, parse_id
from commands.models import (
    Command,
    FailedCommand,
)
from commands.staff import search
from commands.staff.admin_actions import CommandActions
from commands.staff.admin_lists import (
    AgeFilter,
    AuditEntryFilter,
    CappedPaginator,
    ConnectorFilter,
    ErrorClassFilter,
    SkipReasonFilter,
    reason_badge,
    short_error,
)
from commands.staff.command_page import DETAIL_FIELDS, STATE_FIELDS, CommandDetail
from commands.staff.explain import URGENCY, urgency
from commands.states import State


class CommandSearch:
    """The lists' search box: id, idempotency key, connector name, tenant slug, payload text
    (``commands.staff.search``); the admin's own ``search_fields`` too, when ``also_search_fields``."""

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
    search_fields = ["=id"]  # the box; commands.staff.search does the searching
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
    also_search_fields = True  # the error text, besides commands.staff.search
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
