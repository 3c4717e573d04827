"""Celery tasks: the dispatch loop's three steps, for sites that run Celery instead of
``manage.py dispatch`` (beat schedules ``sweep`` and ``recover`` every
``ANKUSA_DISPATCH_INTERVAL_S``, and ``consume`` every ``ANKUSA_DISPATCH_POLL_S`` for the commands
intake queued itself; see ``CELERY_BEAT_SCHEDULE`` in the settings).

Each task calls one function of ``commands.dispatch``. When a step puts items on the queue, it asks
for a ``consume`` with ``transaction.on_commit``, so a worker is never told about an item whose
transaction has not committed. Any number of workers may run these at once: the conditional state
changes in ``commands.dispatch`` keep a command from being sent twice.
"""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.db import transaction

from commands import dispatch, retention


def consume_after_commit() -> None:
    """Ask a worker to drain the queue once the current transaction (if any) has committed."""
    transaction.on_commit(consume.delay)


@shared_task(name="commands.sweep")
def sweep() -> dict:
    summary = dispatch.sweep()
    if summary.taken:
        consume_after_commit()
    return {"taken": summary.taken, "skipped": dict(summary.skipped)}


@shared_task(name="commands.consume")
def consume() -> dict:
    # Beat asks for one every poll period: an empty queue costs a read, not a dispatcher.
    if not dispatch.items_waiting(dispatch.commands_queue()):
        return {"claimed": 0, "results": {}}
    # One interval at most, so a long backlog is shared between workers and beat's next round.
    with dispatch.Dispatcher() as dispatcher:
        summary = dispatcher.drain(max_seconds=settings.ANKUSA_DISPATCH_INTERVAL_S)
    return {"claimed": summary.claimed, "results": dict(summary.results)}


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
