"""Waking the dispatchers when commands can go: the loop's and Celery's side of ``queues.wake``.

A commit that queues items wakes the ``manage.py dispatch`` loops by itself (the queue's own wake:
PostgreSQL's NOTIFY, the Redis wake list). Two things need asking for here: a change that makes
commands due without queueing them (a resend, an approval, a released hold or a resumed
connector: ``commands.dispatch.hold.wake``) wakes the queue by hand, and a loop
woken with nothing queued sweeps; and with ``ANKUSA_DISPATCH_CELERY_WAKE`` every such commit asks
a Celery worker for the poll task, on commit (``commands.tasks.wake_after_commit``).

Not guaranteed: that a wake arrives; the loop's poll and beat's poll (``ANKUSA_DISPATCH_POLL_S``)
stay the safety net.
"""

from __future__ import annotations

from django.conf import settings

from queues.fifo import ReliableFIFO


def after_enqueue() -> None:
    """Items were queued in the current transaction (or just now): with Celery, ask for a drain."""
    if settings.ANKUSA_DISPATCH_CELERY_WAKE:
        from commands import tasks  # above dispatch: the tasks import it

        tasks.wake_after_commit()


def commands_due(queue: ReliableFIFO) -> None:
    """Commands were made due in the current transaction: wake the loops (who sweep) and Celery."""
    queue.wake()
    after_enqueue()
