"""A dispatcher's sends in flight, as tasks on the process's send loop (``event_loop``), and
``_Starts``, the one thread that makes the starts they ask for together in few statements.

The dispatcher's thread keeps the shared list of claimed sends (``waiting``) filled; a scheduler
task on the loop takes from it every send a connector slot allows (``Connector.max_in_flight``,
else ``ANKUSA_DISPATCH_PER_CONNECTOR``; ``Connector.max_per_s`` spaces them), up to ``size``
(``ANKUSA_DISPATCH_CONCURRENCY``) in flight, and runs each as a task: win its start, send, hand
the outcome to the recorder.

Guaranteed: a send goes out only after its ``queued → dispatching`` move committed (the task
awaits the start thread's answer before it sends). The loop never touches the database: starts
are made on the start thread's connection, outcomes on the recorder's, so the sends in flight
cost no database connection and no thread each, however many they are. Not guaranteed: that a
connector's cap holds across processes (it is per process).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections
from django.utils import timezone

from commands.dispatch import adapters, event_loop
from commands.dispatch.recorder import _Recorder
from commands.dispatch.sends import Sent, Unstarted, _Entry
from commands.dispatch.statements import start_sends
from commands.dispatch.timing import CLAIM_POOLS, HELD_POOLS, RECORD_RETRY_FIRST_S, retry_delay

logger = logging.getLogger("ankusa.commands.dispatch")


class _Starts:
    """Makes the starts that senders ask for at about the same time in few statements, on a
    connection of its own: a sender never touches the database, so the sends in flight cost no
    database connection each, whatever their number.

    One thread (``at_once``) makes the statements: each takes every ask waiting when the one before
    it is done, so the statements grow with the load instead of their number. A start is asked for
    only by a sender about to send, so what a statement starts goes out at once. After a statement
    that failed, the next waits a pause doubling up to ``RETRY_MAX_S`` (``failures`` in a row): a
    database that refuses starts costs a log line per try, not a spin of claims and undone starts.
    """

    at_once = 1

    def __init__(self, *, pause: Callable[[int], float] | None = None):
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        # The pause after ``n`` failed statements in a row (injected by tests).
        self.pause = pause or (lambda failures: retry_delay(failures, RECORD_RETRY_FIRST_S))
        self.asked: list[_Ask] = []
        self.closing = False
        self.threads: list[threading.Thread] = []  # started at the first ask
        self.failures = 0  # statements that failed in a row

    def start(self, entry: _Entry, now: datetime) -> bool | Unstarted:
        """Win ``queued → dispatching`` for the entry's attempt (see :func:`start_sends`);
        ``Unstarted`` when the statement failed (the database did not answer): nothing may be sent.

        A shared statement stamps its commands with the ``now`` of the first sender in it,
        milliseconds from each sender's own.
        """
        ask = self.ask(entry, now)
        ask.answered.wait()
        return ask.result()

    def ask(self, entry: _Entry, now: datetime, then: Callable[[_Ask], None] | None = None) -> _Ask:
        """Ask for the start without waiting: ``then(ask)`` is called once it is answered (on the
        start thread, or here when closing), and ``ask.result()`` says how."""
        ask = _Ask(entry, now, then=then)
        with self.lock:
            if self.closing:  # no thread left to answer: not asked, so not sent (Unstarted)
                ask.answered.set()
                if then is not None:
                    then(ask)
                return ask
            if not self.threads:
                self.threads = [
                    threading.Thread(target=self._run, name=f"start-{n}", daemon=True)
                    for n in range(self.at_once)
                ]
                for thread in self.threads:
                    thread.start()
            self.asked.append(ask)
            self.changed.notify()
        return ask

    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    while not self.asked and not self.closing:
                        self.changed.wait()
                    if not self.asked:
                        return
                    batch, self.asked = self.asked, []
                now = batch[0].now
                try:
                    won = start_sends([(one.entry.command.pk, one.entry.attempt) for one in batch], now)
                except Exception:
                    # Nothing was sent: the recorder undoes the starts should the statement have
                    # committed unseen, and puts the items back at the head of the queue (Unstarted).
                    logger.exception("starting %s commands failed", len(batch))
                    connections.close_all()
                    won = None
                self.failures = 0 if won is not None else self.failures + 1  # before the answers
                for one in batch:
                    key = (one.entry.command.pk, one.entry.attempt)
                    if won is None:
                        one.won, one.stamp = None, now
                    else:
                        one.won = key in won
                        won.discard(key)  # of two items for one attempt in the statement, one sends
                    one.answered.set()
                    if one.then is not None:
                        one.then(one)
                if self.failures:
                    pause = self.pause(self.failures)
                    with self.lock:
                        self.changed.wait_for(lambda: self.closing, timeout=pause)
        finally:
            connections.close_all()

    def close(self) -> None:
        """Answer what was asked, and end the thread (once no sender asks any more)."""
        with self.lock:
            self.closing = True
            self.changed.notify_all()
        for thread in self.threads:
            thread.join()


@dataclass(eq=False)
class _Ask:
    entry: _Entry
    now: datetime
    won: bool | None = None  # None once answered: the statement failed
    stamp: datetime | None = None  # the failed statement's time, as it would have stamped the start
    answered: threading.Event = field(default_factory=threading.Event)
    then: Callable[[_Ask], None] | None = None  # called once answered (the send loop's wake-up)

    def result(self) -> bool | Unstarted:
        return Unstarted(self.stamp) if self.won is None else self.won


def hand(
    recorder: _Recorder, entry: _Entry, won, started: datetime, outcome: adapters.Outcome | None
) -> None:
    """What a send in flight gives the recorder: its outcome (sent), None (the start was not ours:
    the item is finished as stale) or ``Unstarted`` (the start failed: undone, the item back)."""
    if won is True and outcome is not None:
        recorder.hand(entry, Sent(entry.command, entry.attempt, started, timezone.now(), outcome))
    else:
        recorder.hand(entry, won if isinstance(won, Unstarted) else None)


class _Wake:
    """What the dispatcher's thread notifies when it adds work: wakes the scheduler on the loop."""

    def __init__(self, senders: _Senders):
        self.senders = senders

    def notify(self, n: int = 1) -> None:
        self.senders.wake()

    def notify_all(self) -> None:
        self.senders.wake()


class _Senders:
    """The sends in flight of one dispatcher (see the module's docstring)."""

    clock = staticmethod(time.monotonic)  # paces connectors with a rate; tests move it

    def __init__(self, size: int, per_connector: int, stop: threading.Event, recorder: _Recorder | None):
        self.size = size
        self.per_connector = per_connector
        self.stop = stop
        self.recorder = recorder
        self.starts = _Starts()
        self.lock = threading.Lock()
        self.work = _Wake(self)  # the dispatcher notifies here when it adds claimed sends
        self.room = threading.Condition(self.lock)  # the dispatcher waits here for room to claim
        self.waiting: deque[_Entry] = deque()
        self.in_flight: Counter[int] = Counter()
        self.next_due: dict[int, float] = {}  # connector -> when its next send is due (monotonic)
        self.pace_wait: float | None = None
        self.halted = False  # the dispatcher stops: take nothing more
        self.closing = False
        self.low_water = (HELD_POOLS - CLAIM_POOLS - 1) * size  # below this, there is room to claim
        self.woken = asyncio.Event()  # bound to the loop at its first wait (there)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.scheduled: Future | None = None
        if size:
            self.loop = event_loop.get()
            self.scheduled = asyncio.run_coroutine_threadsafe(self._schedule(), self.loop)

    def wake(self) -> None:
        """Have the scheduler look again (from any thread)."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.woken.set)

    def _take(self) -> _Entry | None:
        """The first waiting send whose connector allows one more now: a free slot of its cap
        (``Connector.max_in_flight``, else the site's per-connector cap) and, with a rate
        (``Connector.max_per_s``), its next send due. Called holding the lock; sets ``pace_wait``
        to how long until a send held back by its rate is due (None: none is)."""
        self.pace_wait = None
        if self.halted or self.stop.is_set():
            return None
        now = self.clock()
        for index, entry in enumerate(self.waiting):
            connector = entry.command.connector
            if self.in_flight[connector.pk] >= (connector.max_in_flight or self.per_connector):
                continue
            if connector.max_per_s:
                due = self.next_due.get(connector.pk, now)
                if due > now:
                    wait = due - now
                    self.pace_wait = wait if self.pace_wait is None else min(self.pace_wait, wait)
                    continue
                # Evenly spaced: the next one is due an interval after this one was due, so a send
                # taken late keeps the schedule; after an idle spell, one send of catch-up at most.
                self.next_due[connector.pk] = (
                    max(due, now - 1 / connector.max_per_s) + 1 / connector.max_per_s
                )
            del self.waiting[index]
            self.in_flight[connector.pk] += 1
            if len(self.waiting) < self.low_water:
                self.room.notify()
            return entry
        return None

    async def _schedule(self) -> None:
        """Start a task for every send that may go now; wait for a change (or a paced send due)."""
        tasks: set[asyncio.Task] = set()
        while True:
            self.woken.clear()  # before looking: a change made after the look wakes the wait below
            with self.lock:
                while self.in_flight.total() < self.size and (entry := self._take()) is not None:
                    task = asyncio.create_task(self._send(entry))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if self.closing and not self.in_flight.total():
                    return
                pace = self.pace_wait
            try:
                await asyncio.wait_for(self.woken.wait(), pace)
            except TimeoutError:
                pass  # a send held back by its connector's rate is due

    async def _send(self, entry: _Entry) -> None:
        try:
            started = timezone.now()
            won = await self._start(entry, started)
            outcome = None
            if won is True:  # the start committed: now, and only now, it goes out
                outcome = await adapters.send_async(entry.command)  # never raises: a bug is an outcome
            assert self.recorder is not None
            hand(self.recorder, entry, won, started, outcome)
        finally:
            with self.lock:
                self.in_flight[entry.command.connector_id] -= 1
                if not self.in_flight.total():
                    self.room.notify()
            self.woken.set()

    async def _start(self, entry: _Entry, now: datetime) -> Any:
        """Win the start on the start thread; the loop waits for its answer without a thread."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future = loop.create_future()

        def answered(ask: Any) -> None:  # on the start thread
            loop.call_soon_threadsafe(_settle, answer, ask.result())

        self.starts.ask(entry, now, answered)
        return await answer

    def close(self) -> None:
        """Finish the sends in flight (and what may still be taken), then end the start thread."""
        with self.lock:
            self.closing = True
        if self.scheduled is not None:
            self.wake()
            self.scheduled.result()
        self.starts.close()  # after the sends: none asks any more


def _settle(future: asyncio.Future, result: object) -> None:
    if not future.done():
        future.set_result(result)
