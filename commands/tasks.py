"""Celery tasks: the dispatch loop's three steps, for sites that run Celery instead of
``manage.py dispatch`` (beat schedules ``sweep`` every ``ANKUSA_DISPATCH_INTERVAL_S``, ``recover``
every ``ANKUSA_DISPATCH_RECOVER_S``, and ``poll`` every ``ANKUSA_DISPATCH_POLL_S`` for the commands
intake queued itself; see ``CELERY_BEAT_SCHEDULE`` in the settings).

Each task calls one function of ``commands.dispatch``. When a step puts items on the queue, it asks
for a ``consume`` with ``transaction.on_commit``, so a worker is never told about an item whose
transaction has not committed. Any number of workers may run these at once: the conditional state
changes in ``commands.dispatch`` keep a command from being sent twice.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from celery import shared_task
from celery.signals import worker_process_shutdown
from django.conf import settings
from django.core.cache import caches
from django.db import transaction
from redis.exceptions import LockNotOwnedError

from commands import retention
from commands.dispatch import heartbeat, recovery
from commands.dispatch import sweep as sweeping
from commands.dispatch.dispatcher import Dispatcher, DrainSummary, items_waiting
from commands.lifecycle import commands_queue


def consume_after_commit() -> None:
    """Ask a worker to drain the queue once the current transaction (if any) has committed."""
    transaction.on_commit(consume.delay)


@shared_task(name="commands.sweep")
def sweep() -> dict:
    heartbeat.beat("celery")  # once per beat interval: the dashboard's "is the loop alive"
    summary = sweeping.sweep()
    if summary.taken:
        consume_after_commit()
    return {"taken": summary.taken, "skipped": dict(summary.skipped)}


logger = logging.getLogger("ankusa.commands.dispatch")

NOTHING = {"claimed": 0, "results": {}}
# Held (in the Redis cache) by the one poll that drains: see ``poll``.
POLL_LOCK = "ankusa:dispatch:poll"
# The poll lock lives this long unless renewed; its holder renews it every third of that while it
# drains. A worker killed mid-drain therefore holds it this long at most: another worker's poll
# drains within seconds, not after a whole drain's worth of time. Three seconds keep the others'
# wait, plus a poll period and a send, inside the five a database restart may cost; a Redis that
# stalls past it costs two drains at once for a moment, never a second send.
POLL_LOCK_TTL_S = 3.0


@shared_task(name="commands.consume")
def consume() -> dict:
    # An empty queue (a sweep's items taken by another worker already) costs a read, not a dispatcher.
    if not items_waiting(commands_queue()):
        return NOTHING
    return _drain()


# This process's dispatcher and the process it was made in (a forked pool process makes its own),
# and who drains on it: one drain at a time (a threads pool runs several tasks in one process).
_kept: tuple[int, Dispatcher] | None = None
_kept_in_use = threading.Lock()


def _drain() -> dict:
    """A drain on this process's dispatcher, kept between tasks as the loop keeps its own: a drain
    asked by a wake sends at once, rather than first start a pool of senders and a recorder
    (bench/README.md, *Celery sending*). A drain that raised, or left outcomes unwritten (the database
    refused them), closes it: its outcomes are spooled (``_Recorder``) and the next drain starts a
    new one. Between two drains it holds no send and no outcome, only idle threads and connections.
    A drain while another of the same process runs on it gets a dispatcher of its own, as before."""
    # One interval at most, so a long backlog is shared between workers and beat's next round.
    max_seconds = settings.ANKUSA_DISPATCH_INTERVAL_S
    if _kept_in_use.acquire(blocking=False):
        try:
            summary = _drain_kept(max_seconds)
        finally:
            _kept_in_use.release()
    else:
        with Dispatcher() as dispatcher:
            summary = dispatcher.drain(max_seconds=max_seconds)
    return {"claimed": summary.claimed, "results": dict(summary.results)}


def _drain_kept(max_seconds: float) -> DrainSummary:
    global _kept
    if _kept is None or _kept[0] != os.getpid():
        _kept = (os.getpid(), Dispatcher())
    dispatcher, clean = _kept[1], False
    try:
        summary = dispatcher.drain(max_seconds=max_seconds)
        clean = not dispatcher.pending_commands()
    finally:
        if not clean:
            forget_dispatcher()
    return summary


def forget_dispatcher() -> None:
    """Close this process's kept dispatcher, if it has one (its outcomes written or spooled)."""
    global _kept
    kept, _kept = _kept, None
    if kept is not None and kept[0] == os.getpid():
        kept[1].close()


@worker_process_shutdown.connect
def _close_kept_dispatcher(**kwargs) -> None:
    forget_dispatcher()  # a pool process that ends: nothing is in flight between drains


@contextlib.contextmanager
def renewed(lock, every: float):
    """Keep ``lock`` (redis-py's) alive while the block runs: a thread resets its time to live
    every ``every`` seconds, and stops when the block ends or the lock is no longer ours."""
    done = threading.Event()

    def renew() -> None:
        while not done.wait(every):
            try:
                lock.reacquire()
            except LockNotOwnedError:  # expired (Redis stalled past the TTL) and maybe taken since
                logger.warning("dispatch poll: the lock expired during a drain; another may drain too")
                return
            except Exception as exc:  # Redis out of reach: tried again at the next beat
                logger.warning("dispatch poll: the lock could not be renewed (%s)", exc)

    thread = threading.Thread(target=renew, name="poll-lock", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@shared_task(name="commands.poll")
def poll(sweep: bool = False) -> dict:
    """Beat's look at the queue every poll period, for what intake queued: a drain if an item
    waits and no other poll is draining, fleet-wide. A poll a second, each drain lasting up to an
    interval, would otherwise start a dispatcher in every worker process (its pool of senders and
    connections each, the per-connector cap as many times over at one receiver). The lock is
    short and renewed while the drain runs (``POLL_LOCK_TTL_S``), so a killed worker stalls the
    others for seconds. A poll that ends its drain with work still waiting asks for the next one
    as it releases the lock.

    ``sweep``: asked by a wake (``commands.wake``). Work was most likely just queued, so it drains
    without a look first, as the loop does when woken. A drain that claims nothing sweeps (the wake
    may have made commands due rather than queued them) and drains what that queued. A wake that
    meets another poll draining sweeps only if nothing waits: that drain takes what is queued."""
    queue = commands_queue()
    if not sweep and not items_waiting(queue):
        return NOTHING
    # redis-py's lock, through django-redis: released only by the poll that holds it (a token),
    # kept where the renewing thread sees it too (not thread-local).
    lock = caches["redis"].lock(POLL_LOCK, timeout=POLL_LOCK_TTL_S, thread_local=False)
    try:
        held = lock.acquire(blocking=False)
    except Exception:  # Redis out of reach: draining unlocked costs overlap, never a second send
        logger.warning("dispatch poll: the lock could not be taken; draining without it")
        held, lock = True, None
    if not held:
        if sweep and not items_waiting(queue):
            sweeping.sweep()
        return {**NOTHING, "busy": True}
    if lock is None:
        return _drain_polled(sweep)
    try:
        with renewed(lock, POLL_LOCK_TTL_S / 3):
            return _drain_polled(sweep)
    finally:
        with contextlib.suppress(Exception):  # expired and taken since, or Redis gone: not ours
            lock.release()
        # A wake that met the lock while this drain ended was turned away: the released lock asks
        # again if work waits, rather than leave it to beat's next poll.
        with contextlib.suppress(Exception):
            if settings.ANKUSA_DISPATCH_CELERY_WAKE and items_waiting(queue):
                poll.delay()


def _drain_polled(sweep: bool) -> dict:
    """A poll's drain; with ``sweep``, one that claimed nothing sweeps and drains what that queued."""
    drained = _drain()
    if sweep and not drained["claimed"] and sweeping.sweep().taken:
        drained = _drain()
    return drained


@shared_task(name="commands.recover")
def recover() -> dict:
    summary = recovery.recover()
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
