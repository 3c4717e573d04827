"""Staff's view of the queues: database items by sub-queue, and every queue of both backends.

* The ``QueueItem`` list (database backend): payload, age, attempts and error, filtered by queue
  and sub-queue. Actions requeue (busy and failed items to the tail of main) and drop, on the
  selection or on everything matching the filter ("select all"), after a page that shows the
  count. Each action calls one function in ``queues.actions``.
* ``Queue overview`` (``admin/queues/queueitem/overview/``): lengths and oldest ages of every
  queue of both backends (``queues.actions.overview``); a backend that fails is a line on the page.
  Each Redis queue links to its own page.
* A Redis queue's page (``admin/queues/queueitem/redis/<name>/?kind=main|busy|failed``): the
  sub-queue's length and its first 100 items (``peek``) with payload, age, attempts and error.
  Requeue (busy and failed) and drop, on the ticked items or on every item of the sub-queue,
  each after a page that shows the count; only a POST carrying the confirmation changes anything.
  Permissions as on the database list: view to see, change to requeue, delete to drop. A Redis
  outage is a message on the page; an unknown kind or a non-numeric id is a 400, an unknown
  queue a 404.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Count
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.text import Truncator
from django.utils.timesince import timesince
from redis.exceptions import RedisError

from ankusa_site.core.admin import ModelAdmin, readable_json, selected_across
from queues import actions
from queues.fifo import KINDS, Item, Kind
from queues.models import QueueItem

State = QueueItem.State
# What the page of a Redis queue lists of a sub-queue: a page's worth, like the database list.
REDIS_PAGE_ITEMS = 100
# The buttons of that page: (verb, scope).
OPERATIONS = {
    "requeue_selected": ("requeue", "selected"),
    "drop_selected": ("drop", "selected"),
    "requeue_all": ("requeue", "all"),
    "drop_all": ("drop", "all"),
}


def short_json(value) -> str:
    """A payload as the lists show it: JSON, cut to 80 characters."""
    return Truncator(readable_json(value)).chars(80)


def short_text(text: str) -> str:
    """An error as the lists show it: cut to 80 characters."""
    return Truncator(text).chars(80)


@admin.register(QueueItem)
class QueueItemAdmin(ModelAdmin):
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
        return short_json(item.payload)

    @admin.display(description="in this sub-queue for")
    def age(self, item: QueueItem) -> str:
        since = {State.MAIN: item.enqueued_at, State.BUSY: item.claimed_at, State.FAILED: item.failed_at}[
            item.state
        ]
        return timesince(since, timezone.now()) if since else "-"

    @admin.display(description="last error")
    def short_error(self, item: QueueItem) -> str:
        return short_text(item.last_error)

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
            "select_across": selected_across(request),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/queues/confirm_action.html", context)

    # --- the overview of every queue ----------------------------------------------------------------

    def get_urls(self):
        overview = self.admin_site.admin_view(self.overview_view)
        redis_items = self.admin_site.admin_view(self.redis_items_view)
        return [
            path("overview/", overview, name="queues_overview"),
            path("redis/<str:name>/", redis_items, name="queues_redis_items"),
            *super().get_urls(),
        ]

    def overview_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        data = actions.overview()
        changelist = reverse("admin:queues_queueitem_changelist")
        for row in data["queues"]:
            if row["backend"] == "database":
                row["link"] = f"{changelist}?queue={row['name']}"
            else:
                row["link"] = reverse("admin:queues_redis_items", args=[row["name"]])
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue overview",
            "opts": self.model._meta,
            "queues": data["queues"],
            "problems": data["problems"],
        }
        return TemplateResponse(request, "admin/queues/overview.html", context)

    # --- the items of one Redis queue ---------------------------------------------------------------

    def redis_items_view(self, request, name: str):
        if not self.has_view_permission(request):
            raise PermissionDenied
        kind = request.GET.get("kind", "main")
        if kind not in KINDS:
            raise BadRequest(f"kind must be one of {', '.join(KINDS)}.")
        page = f"{reverse('admin:queues_redis_items', args=[name])}?kind={kind}"
        context = {
            **self.admin_site.each_context(request),
            "title": f"Redis queue {name}: {kind}",
            "opts": self.model._meta,
            "name": name,
            "kind": kind,
            "kinds": KINDS,
            "page": page,
        }
        try:
            queue = actions.redis_queue(name)
            if queue is None:
                raise Http404(f"No Redis queue is called {name!r}.")
            if request.method == "POST":
                return self._redis_operation(request, queue, kind, page, context)
            length, items = queue.length(kind), queue.peek(kind, REDIS_PAGE_ITEMS)
        except RedisError as exc:  # an outage is a message on the page, never a 500
            context["error"] = f"Redis: {type(exc).__name__}: {exc}"
            return TemplateResponse(request, "admin/queues/redis_items.html", context)
        now = queue.clock()
        context.update(
            length=length,
            rows=[_redis_row(item, kind, now) for item in items],
            can_requeue=kind != "main" and self.has_requeue_permission(request),
            can_drop=self.has_delete_permission(request),
        )
        return TemplateResponse(request, "admin/queues/redis_items.html", context)

    def _redis_operation(self, request, queue, kind: str, page: str, context: dict):
        """Check, then show the count (no ``confirmed``) or do it and go back to the list."""
        verb, scope = OPERATIONS.get(request.POST.get("operation", ""), (None, None))
        if verb is None:
            raise BadRequest("operation must be one of " + ", ".join(OPERATIONS) + ".")
        allowed = (
            self.has_requeue_permission(request) if verb == "requeue" else self.has_delete_permission(request)
        )
        if not allowed:
            raise PermissionDenied
        try:
            ids = sorted({int(pk) for pk in request.POST.getlist("ids")})
        except ValueError:
            raise BadRequest("ids must be item numbers.") from None
        if verb == "requeue" and kind == "main":
            self.message_user(
                request, "Items in main are waiting already: nothing to requeue.", messages.WARNING
            )
            return HttpResponseRedirect(page)
        if scope == "selected" and not ids:
            self.message_user(request, "Tick the items first.", messages.WARNING)
            return HttpResponseRedirect(page)
        if request.POST.get("confirmed") != "yes":
            total = len(ids) if scope == "selected" else queue.length(kind)
            context.update(
                title=f"{verb.capitalize()} items of Redis queue {queue.name}?",
                verb=verb,
                scope=scope,
                operation=request.POST["operation"],
                ids=ids,
                total=total,
            )
            return TemplateResponse(request, "admin/queues/redis_confirm.html", context)
        if scope == "selected":
            perform = actions.requeue_chosen if verb == "requeue" else actions.drop_chosen
            done = perform(queue, ids)
        else:
            perform = actions.requeue_sub_queue if verb == "requeue" else actions.drop_sub_queue
            done = perform(queue, kind)
        self.message_user(request, f"{done} item(s): {verb} done.", messages.SUCCESS)
        return HttpResponseRedirect(page)


def _redis_row(item: Item, kind: Kind, now) -> dict:
    since = item.since(kind)
    return {
        "id": item.id,
        "payload": short_json(item.payload),
        "age": timesince(since, now) if since else "-",
        "claims": item.claims,
        "requeues": item.requeue_count,
        "fails": item.fail_count,
        "error": short_text(item.last_error),
    }
