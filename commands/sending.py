"""A dispatcher's sends in flight: tasks on the process's send loop (``commands.event_loop``).

The dispatcher's thread keeps the shared list of claimed sends (``waiting``) filled; a scheduler
task on the loop takes from it every send a connector slot allows (``Connector.max_in_flight``,
else ``ANKUSA_DISPATCH_PER_CONNECTOR``; ``Connector.max_per_s`` spaces them), up to ``size``
(``ANKUSA_DISPATCH_CONCURRENCY``) in flight, and runs each as a task: win its start, send, hand
the outcome to the recorder.

Guaranteed: a send goes out only after its ``queued → dispatching`` move committed (the task
awaits the start thread's answer before it sends). The loop never touches
the database: starts are made on the start thread's connection, outcomes on the recorder's, so
the sends in flight cost no database connection each, however many they are.

Not guaranteed: that a connector's cap holds across processes (it is per process).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from commands import adapters, event_loop

if TYPE_CHECKING:
    from datetime import datetime

# What the dispatcher gives (commands.dispatch; not imported here, it imports this module):
Entry = Any  # a claimed send: ``.command`` (its ``.connector``), ``.attempt``, ``.item``
# hand(entry, won, started, outcome): the start's answer (True, False: not ours, or what a failed
# start gives) and the outcome when it was sent (None otherwise), for the recorder.
Hand = Callable[[Any, Any, "datetime", "adapters.Outcome | None"], None]


class _Wake:
    """What the dispatcher's thread notifies when it adds work: wakes the scheduler on the loop."""

    def __init__(self, senders: Senders):
        self.senders = senders

    def notify(self, n: int = 1) -> None:
        self.senders.wake()

    def notify_all(self) -> None:
        self.senders.wake()


class Senders:
    clock = staticmethod(time.monotonic)  # paces connectors with a rate; tests move it

    def __init__(
        self,
        size: int,
        per_connector: int,
        stop: threading.Event,
        *,
        starts: Any = None,
        hand: Hand | None = None,
        recorder: Any = None,
        low_water: int = 0,
    ):
        """``starts``: the dispatcher's start thread (``ask(entry, now, then)``); ``hand``: where a
        finished send goes; ``recorder``: kept for the dispatcher; ``low_water``: below this many
        waiting, the dispatcher is told there is room to claim."""
        self.size = size
        self.per_connector = per_connector
        self.stop = stop
        self.starts = starts
        self.hand = hand
        self.recorder = recorder
        self.lock = threading.Lock()
        self.work = _Wake(self)  # the dispatcher notifies here when it adds claimed sends
        self.room = threading.Condition(self.lock)  # the dispatcher waits here for room to claim
        self.waiting: deque[Entry] = deque()
        self.in_flight: Counter[int] = Counter()
        self.next_due: dict[int, float] = {}  # connector -> when its next send is due (monotonic)
        self.pace_wait: float | None = None
        self.halted = False  # the dispatcher stops: take nothing more
        self.closing = False
        self.low_water = low_water
        self.loop: asyncio.AbstractEventLoop | None = None
        self.woken = asyncio.Event()  # bound to the loop at its first wait (there)
        self.scheduled: Future | None = None
        if size:
            self.loop = event_loop.get()
            self.scheduled = asyncio.run_coroutine_threadsafe(self._schedule(), self.loop)

    def wake(self) -> None:
        """Have the scheduler look again (from any thread)."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.woken.set)

    def _take(self) -> Entry | None:
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

    async def _send(self, entry: Entry) -> None:
        try:
            started = timezone.now()
            won = await self._start(entry, started)
            outcome = None
            if won is True:  # the start committed: now, and only now, it goes out
                outcome = await adapters.send_async(entry.command)  # never raises: a bug is an outcome
            assert self.hand is not None
            self.hand(entry, won, started, outcome)
        finally:
            with self.lock:
                self.in_flight[entry.command.connector_id] -= 1
                if not self.in_flight.total():
                    self.room.notify()
            self.woken.set()

    async def _start(self, entry: Entry, now: datetime) -> Any:
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
