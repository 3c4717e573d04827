"""What operators do to queues, for the admin, the REST API and ``manage.py queues`` alike.

Each interface parses its input, checks permission and calls one function here (or one method of
the queue), so the three behave the same. Which queues exist: every queue name with a row in the
database backend, every name in the Redis registry (only when this site uses Redis at all, so a
site without Redis never waits on it), and every name the settings route to a backend.

What it does NOT do: show a queue that exists only in a Redis this site is not configured to use,
or stop a Redis outage from being an error line in the overview (never a failed page).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from ankusa_site.health import redis_in_use
from ankusa_site.logs import log_event
from queues.backends.database import DatabaseFIFO
from queues.fifo import ReliableFIFO, backend_for, get_queue
from queues.models import QueueItem

logger = logging.getLogger("ankusa.queues")


def known_queues() -> tuple[list[ReliableFIFO], list[str]]:
    """Every queue of both backends, by name, and the problems met while listing them."""
    names: dict[tuple[str, str], None] = {}
    for name in settings.ANKUSA_QUEUE_BACKENDS:
        names[(name, backend_for(name))] = None
    for name in QueueItem.objects.order_by().values_list("queue", flat=True).distinct():
        names[(name, "database")] = None
    problems = []
    if redis_in_use():
        from queues.backends.redis import known_queues as redis_queue_names

        try:
            for name in redis_queue_names():
                names[(name, "redis")] = None
        except Exception as exc:  # noqa: BLE001 - a Redis outage is a line on the page, not a 500
            problems.append(f"Redis: {type(exc).__name__}: {exc}")
    queues = [get_queue(name, backend=backend) for name, backend in sorted(names)]
    return queues, problems


def overview() -> dict[str, Any]:
    """Lengths and ages of every known queue; a queue whose backend fails shows its error."""
    queues, problems = known_queues()
    rows = []
    for queue in queues:
        try:
            rows.append(queue.stats())
        except Exception as exc:  # noqa: BLE001 - one broken backend must not hide the others
            rows.append(
                {"name": queue.name, "backend": queue.backend, "error": f"{type(exc).__name__}: {exc}"}
            )
    return {"queues": rows, "problems": problems}


def _by_queue(items: QuerySet[QueueItem]) -> Iterable[tuple[DatabaseFIFO, list[int]]]:
    grouped: dict[str, list[int]] = {}
    for name, pk in items.order_by("queue", "id").values_list("queue", "id"):
        grouped.setdefault(name, []).append(pk)
    for name, ids in grouped.items():
        yield get_queue(name, backend="database"), ids


def requeue_items(items: QuerySet[QueueItem]) -> int:
    """Put the chosen busy and failed database items at the tail of their queues."""
    moved = sum(queue.requeue_ids(ids) for queue, ids in _by_queue(items))
    log_event(logger, "queue_items_requeued_by_operator", count=moved)
    return moved


def drop_items(items: QuerySet[QueueItem]) -> int:
    """Delete the chosen database items."""
    dropped = sum(queue.drop_ids(ids) for queue, ids in _by_queue(items))
    log_event(logger, "queue_items_dropped_by_operator", count=dropped)
    return dropped
