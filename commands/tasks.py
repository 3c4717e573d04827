"""Celery tasks: the dispatch loop's three steps, for sites that run Celery instead of
``manage.py dispatch`` (beat schedules ``sweep`` and ``recover`` every
``ANKUSA_DISPATCH_INTERVAL_S``, and ``poll`` every ``ANKUSA_DISPATCH_POLL_S`` for the commands
intake queued itself; see ``CELERY_BEAT_SCHEDULE`` in the settings).

Each task calls one function of ``commands.dispatch``. When a step puts items on the queue, it asks
for a ``consume`` with ``transaction.on_commit``, so a worker is never told about an item whose
transaction has not committed. Any number of workers may run these at once: the conditional state
changes in ``commands.dispatch`` keep a command from being sent twice.
"""

from __future__ import annotations

import contextlib
import logging

from celery import shared_task
from django.conf import settings
from django.core.cache import caches
from django.db import transaction

from commands import dispatch, heartbeat, retention
from commands.adapters.http import longest_send_s


def consume_after_commit() -> None:
    """Ask a worker to drain the queue once the current transaction (if any) has committed."""
    transaction.on_commit(consume.delay)


@shared_task(name="commands.sweep")
def sweep() -> dict:
    heartbeat.beat("celery")  # once per beat interval: the dashboard's "is the loop alive"
    summary = dispatch.sweep()
    if summary.taken:
        consume_after_commit()
    return {"taken": summary.taken, "skipped": dict(summary.skipped)}


logger = logging.getLogger("ankusa.commands.dispatch")

NOTHING = {"claimed": 0, "results": {}}
# Held (in the Redis cache) by the one poll that drains: see ``poll``.
POLL_LOCK = "ankusa:dispatch:poll"


@shared_task(name="commands.consume")
def consume() -> dict:
    # An empty queue (a sweep's items taken by another worker already) costs a read, not a dispatcher.
    if not dispatch.items_waiting(dispatch.commands_queue()):
        return NOTHING
    return _drain()


def _drain() -> dict:
    # One interval at most, so a long backlog is shared between workers and beat's next round.
    with dispatch.Dispatcher() as dispatcher:
        summary = dispatcher.drain(max_seconds=settings.ANKUSA_DISPATCH_INTERVAL_S)
    return {"claimed": summary.claimed, "results": dict(summary.results)}


@shared_task(name="commands.poll")
def poll() -> dict:
    """Beat's look at the queue every poll period, for what intake queued: a drain if an item
    waits and no other poll is draining, fleet-wide. A poll a second, each drain lasting up to an
    interval, would otherwise start a dispatcher in every worker process (its pool of senders and
    connections each, the per-connector cap as many times over at one receiver)."""
    if not dispatch.items_waiting(dispatch.commands_queue()):
        return NOTHING
    # A drain claims for an interval at most, then finishes the sends it started.
    longest = settings.ANKUSA_DISPATCH_INTERVAL_S + longest_send_s()
    # redis-py's lock, through django-redis: released only by the poll that holds it (a token).
    lock = caches["redis"].lock(POLL_LOCK, timeout=longest + 10)
    try:
        held = lock.acquire(blocking=False)
    except Exception:  # Redis out of reach: draining unlocked costs overlap, never a second send
        logger.warning("dispatch poll: the lock could not be taken; draining without it")
        held, lock = True, None
    if not held:
        return {**NOTHING, "busy": True}
    try:
        return _drain()
    finally:
        if lock is not None:
            with contextlib.suppress(Exception):  # expired and taken since, or Redis gone: not ours
                lock.release()


@shared_task(name="commands.recover")
def recover() -> dict:
    summary = dispatch.recover()
    if summary.items_requeued or summary.lost_requeued:
        consume_after_commit()
    return {
        "worker_lost": summary.worker_lost,
        "items_requeued": summary.items_requeued,
        "lost_requeued": summary.lost_requeued,
    }


@shared_task(name="commands.prune")
def prune() -> dict:
    return retention.prune().removed
