"""What operators do to queues, for the admin, the REST API and ``manage.py queues`` alike.

Each interface parses its input, checks permission and calls one function here (or one method of
the queue), so the three behave the same. Which queues exist: every queue name with a row in the
database backend, every name in the Redis registry (only when this site uses Redis at all, so a
site without Redis never waits on it), and every name the settings route to a backend.

Acting on chosen items of any backend: ``requeue_chosen`` / ``drop_chosen`` call the queue's
``requeue_ids`` / ``drop_ids``, one atomic step, and log one line (the admin's page of a Redis
queue calls them; the database list's ``requeue_items`` / ``drop_items`` call them per queue).
Acting on every item of a sub-queue (``requeue_sub_queue`` / ``drop_sub_queue``) means what ticking
each of them would mean: failed uses the queue's own ``requeue_failed`` / ``remove_failed`` on what
failed by the start (``delay`` / ``older_than`` of zero); busy
and main are walked ``peek`` by ``peek`` from the head, ``BATCH`` ids per step, up to the length
seen at the start and stopping at the first item that entered since the start (busy: claimed
since; main: enqueued since), so items arriving meanwhile are left alone and no step holds Redis
or a transaction for long. Not ``handle_expired(timedelta(0))``: that counts towards the requeue
limit and into the recovery metric, and this is neither. Cost: O(sub-queue) in steps of
``BATCH``; a worker holding a busy item loses it (its ``done`` becomes a no-op), and an item
claimed between a step's peek and its drop is dropped from busy. The walk stops by time, not by
position: an item requeued to the tail of main meanwhile keeps its first enqueue time, so it may
be reached when consumers claim items under the walk; an item enqueued meanwhile on a node whose
clock runs behind counts as there at the start.

What it does NOT do: show a queue that exists only in a Redis this site is not configured to use,
or stop a Redis outage from being an error line in the overview (never a failed page).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from itertools import takewhile
from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from ankusa_site.core.health import redis_in_use
from ankusa_site.core.logs import log_event
from queues.backends import backend_for, get_queue
from queues.backends.database import DatabaseFIFO
from queues.fifo import NAME_PATTERN, Item, Kind, ReliableFIFO
from queues.models import QueueItem

logger = logging.getLogger("ankusa.queues")
# Ids per step of an action on every item of a busy or main sub-queue: one peek and one script
# each, so Redis is never held for more than a few milliseconds.
BATCH = 1000


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
    """Put the chosen busy and failed database items at the tail of their queues (``requeue_chosen``
    per queue, so one log line per queue)."""
    return sum(requeue_chosen(queue, ids) for queue, ids in _by_queue(items))


def drop_items(items: QuerySet[QueueItem]) -> int:
    """Delete the chosen database items (``drop_chosen`` per queue, so one log line per queue)."""
    return sum(drop_chosen(queue, ids) for queue, ids in _by_queue(items))


# --- Redis queues, item by item ------------------------------------------------------------------


def redis_queue(name: str) -> ReliableFIFO | None:
    """The Redis queue called ``name``, or None when no such queue exists: one in the registry
    (it had items once) or one the settings send to Redis. Raises ``RedisError`` on an outage."""
    if not NAME_PATTERN.match(name):
        return None
    from queues.backends.redis import is_known_queue

    if backend_for(name) == "redis" or is_known_queue(name):
        return get_queue(name, backend="redis")
    return None


def requeue_chosen(queue: ReliableFIFO, ids: list[int]) -> int:
    """Put the chosen busy and failed items of one queue at its tail, with a fresh requeue count."""
    moved = queue.requeue_ids(ids)
    log_event(
        logger, "queue_items_requeued_by_operator", queue=queue.name, backend=queue.backend, count=moved
    )
    return moved


def drop_chosen(queue: ReliableFIFO, ids: list[int]) -> int:
    """Delete the chosen items of one queue, whatever their sub-queue."""
    dropped = queue.drop_ids(ids)
    log_event(
        logger, "queue_items_dropped_by_operator", queue=queue.name, backend=queue.backend, count=dropped
    )
    return dropped


def requeue_sub_queue(queue: ReliableFIFO, kind: Kind) -> int:
    """Put every busy (or failed) item of a queue at its tail, with a fresh requeue count."""
    if kind == "main":
        raise ValueError("Items in main are waiting already: there is nothing to requeue.")
    if kind == "failed":
        moved = queue.requeue_failed(delay=timedelta(0))  # what failed by now, not while it runs
    else:
        moved = _step_through(queue, kind, queue.requeue_ids)
    log_event(
        logger,
        "queue_sub_queue_requeued_by_operator",
        queue=queue.name,
        backend=queue.backend,
        kind=kind,
        count=moved,
    )
    return moved


def drop_sub_queue(queue: ReliableFIFO, kind: Kind) -> int:
    """Delete every item of one sub-queue of a queue."""
    if kind == "failed":
        dropped = queue.remove_failed(older_than=timedelta(0))  # what failed by now, not while it runs
    else:
        dropped = _step_through(queue, kind, queue.drop_ids)
    log_event(
        logger,
        "queue_sub_queue_dropped_by_operator",
        queue=queue.name,
        backend=queue.backend,
        kind=kind,
        count=dropped,
    )
    return dropped


def _step_through(queue: ReliableFIFO, kind: Kind, act) -> int:
    """``act(ids)`` on the items of busy or main, ``BATCH`` at a time, from the head: at most the
    length seen now, and never past the first item that entered the sub-queue since now (busy: a
    claim made since; main: an item enqueued since, as new items join its tail)."""
    started = queue.clock()
    remaining = queue.length(kind)
    total = 0
    while remaining > 0:
        peeked = queue.peek(kind, min(BATCH, remaining))
        items = list(takewhile(lambda item: _entered_by(item, kind, started), peeked))
        if not items:
            break
        total += act([item.id for item in items])
        remaining -= len(items)
    return total


def _entered_by(item: Item, kind: Kind, moment: datetime) -> bool:
    """Whether the item was in sub-queue ``kind`` by ``moment``."""
    since = item.since(kind)
    return since is not None and since <= moment
