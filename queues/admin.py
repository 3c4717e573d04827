"""Staff's view of the queues: database items by sub-queue, and every queue of both backends.

* The ``QueueItem`` list (database backend): payload, age, attempts and error, filtered by queue
  and sub-queue. Actions requeue (busy and failed items to the tail of main) and drop, on the
  selection or on everything matching the filter ("select all"), after a page that shows the
  count. Each action calls one function in ``queues.actions``.
* ``Queue overview`` (``admin/queues/queueitem/overview/``): lengths and oldest ages of every
  queue of both backends (``queues.actions.overview``); a backend that fails is a line on the page.

Redis items are not rows, so they have no list here: the overview shows their counts and ages,
and ``manage.py queues`` / the REST API repair them.
"""

from __future__ import annotations

import json

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import Count
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.text import Truncator
from django.utils.timesince import timesince

from queues import actions
from queues.models import QueueItem

State = QueueItem.State


@admin.register(QueueItem)
class QueueItemAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "queue",
        "state",
        "short_payload",
        "age",
        "claims",
        "requeue_count",
        "fail_count",
        "short_error",
    ]
    list_display_links = ["id"]
    list_filter = ["state", "queue"]
    search_fields = ["=id"]
    ordering = ["queue", "position", "id"]
    show_full_result_count = False  # a million waiting items: no second COUNT(*) per page
    list_per_page = 100
    actions = ["requeue_selected", "drop_selected"]
    readonly_fields = [field.name for field in QueueItem._meta.fields]
    change_list_template = "admin/queues/queueitem/change_list.html"

    def has_add_permission(self, request) -> bool:
        return False  # items come from enqueue, never from a form

    def has_requeue_permission(self, request) -> bool:
        return request.user.has_perm("queues.change_queueitem")

    @admin.display(description="payload")
    def short_payload(self, item: QueueItem) -> str:
        return Truncator(json.dumps(item.payload, ensure_ascii=False)).chars(80)

    @admin.display(description="in this sub-queue for")
    def age(self, item: QueueItem) -> str:
        since = {State.MAIN: item.enqueued_at, State.BUSY: item.claimed_at, State.FAILED: item.failed_at}[
            item.state
        ]
        return timesince(since, timezone.now()) if since else "-"

    @admin.display(description="last error")
    def short_error(self, item: QueueItem) -> str:
        return Truncator(item.last_error).chars(80)

    # --- actions: a confirmation page with the count, then one domain call --------------------------

    @admin.action(permissions=["requeue"], description="Requeue the selected busy / failed items")
    def requeue_selected(self, request, queryset):
        return self._confirm(request, queryset, "requeue_selected", "requeue", actions.requeue_items)

    @admin.action(permissions=["delete"], description="Drop the selected items")
    def drop_selected(self, request, queryset):
        return self._confirm(request, queryset, "drop_selected", "drop", actions.drop_items)

    def _confirm(self, request, queryset, action: str, verb: str, perform):
        if request.POST.get("confirmed") == "yes":
            done = perform(queryset)
            self.message_user(request, f"{done} item(s): {verb} done.", messages.SUCCESS)
            return None
        counts = dict(queryset.order_by().values_list("state").annotate(n=Count("id")))
        context = {
            **self.admin_site.each_context(request),
            "title": f"{verb.capitalize()} queue items?",
            "opts": self.model._meta,
            "action": action,
            "verb": verb,
            "total": sum(counts.values()),
            "counts": [(State(state).label, count) for state, count in sorted(counts.items())],
            "select_across": request.POST.get("select_across") == "1",
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/queues/confirm_action.html", context)

    # --- the overview of every queue ----------------------------------------------------------------

    def get_urls(self):
        overview = self.admin_site.admin_view(self.overview_view)
        return [path("overview/", overview, name="queues_overview"), *super().get_urls()]

    def overview_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        data = actions.overview()
        changelist = reverse("admin:queues_queueitem_changelist")
        for row in data["queues"]:
            if row["backend"] == "database":
                row["link"] = f"{changelist}?queue={row['name']}"
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue overview",
            "opts": self.model._meta,
            "queues": data["queues"],
            "problems": data["problems"],
        }
        return TemplateResponse(request, "admin/queues/overview.html", context)
