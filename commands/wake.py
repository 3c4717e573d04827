"""Waking the dispatchers when commands can go: the loop's and Celery's side of ``queues.wake``.

A commit that queues items wakes the ``manage.py dispatch`` loops by itself (the queue's own wake:
PostgreSQL's NOTIFY, the Redis wake list). Two things need asking for here: a change that makes
commands due without queueing them (a resend, an approval, a released hold or a resumed
connector: ``commands.dispatch.hold.wake``) wakes the queue by hand, and a loop
woken with nothing queued sweeps; and with ``ANKUSA_DISPATCH_CELERY_WAKE`` every such commit asks
a Celery worker for the poll task (``commands.poll``, by name: the tasks import the dispatch
modules, which wake), on commit.

Not guaranteed: that a wake arrives; the loop's poll and beat's poll (``ANKUSA_DISPATCH_POLL_S``)
stay the safety net.
"""

from __future__ import annotations

import logging
import time

from celery import current_app
from django.conf import settings
from django.db import transaction

from queues.fifo import ReliableFIFO

logger = logging.getLogger("ankusa.commands.dispatch")

# A process asks for at most one poll in this time: under load one drain serves many commits (it
# keeps claiming while work is queued), and beat's poll catches what an ask skipped.
WAKE_EVERY_S = 0.05
_last_wake = [0.0]


def after_enqueue() -> None:
    """Items were queued in the current transaction (or just now): with Celery, ask for a drain."""
    if settings.ANKUSA_DISPATCH_CELERY_WAKE:
        transaction.on_commit(_ask_poll)


def commands_due(queue: ReliableFIFO) -> None:
    """Commands were made due in the current transaction: wake the loops (who sweep) and Celery."""
    queue.wake()
    after_enqueue()


def _ask_poll() -> None:
    now = time.monotonic()
    if now - _last_wake[0] < WAKE_EVERY_S:
        return
    _last_wake[0] = now
    try:
        current_app.send_task("commands.poll", kwargs={"sweep": True})
    except Exception as exc:  # the broker is down: beat's poll is the safety net
        logger.warning("dispatch wake: the poll could not be asked for (%s)", exc)
