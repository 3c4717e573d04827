"""The sender pool: threads that each take the next claimed send a connector slot (and rate) allows,
win its start and send it at once, handing the outcome to the recorder; and ``_Starts``, the one
thread that makes the starts senders ask for together in few statements. Senders never touch the
database: the sends in flight cost no connection each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connections
from django.utils import timezone

from commands.dispatch import adapters
from commands.dispatch.recorder import _Recorder
from commands.dispatch.sends import Sent, Unstarted, _Entry
from commands.dispatch.statements import start_sends
from commands.dispatch.timing import CLAIM_POOLS, HELD_POOLS

logger = logging.getLogger("ankusa.commands.dispatch")


class _Starts:
    """Makes the starts that senders ask for at about the same time in few statements, on a
    connection of its own: a sender never touches the database, so the sends in flight cost no
    database connection each, whatever their number.

    One thread (``at_once``) makes the statements: each takes every ask waiting when the one before
    it is done, so the statements grow with the load instead of their number. A start is asked for
    only by a sender about to send, so what a statement starts goes out at once.
    """

    at_once = 1

    def __init__(self):
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.asked: list[_Ask] = []
        self.closing = False
        self.threads: list[threading.Thread] = []  # started at the first ask

    def start(self, entry: _Entry, now: datetime) -> bool | Unstarted:
        """Win ``queued → dispatching`` for the entry's attempt (see :func:`start_sends`);
        ``Unstarted`` when the statement failed (the database did not answer): nothing may be sent.

        A shared statement stamps its commands with the ``now`` of the first sender in it,
        milliseconds from each sender's own.
        """
        ask = _Ask(entry, now)
        with self.lock:
            if self.closing:  # no thread left to answer: not asked, so not sent
                return Unstarted()
            if not self.threads:
                self.threads = [
                    threading.Thread(target=self._run, name=f"start-{n}", daemon=True)
                    for n in range(self.at_once)
                ]
                for thread in self.threads:
                    thread.start()
            self.asked.append(ask)
            self.changed.notify()
        ask.answered.wait()
        return Unstarted(ask.stamp) if ask.won is None else ask.won

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
                for one in batch:
                    key = (one.entry.command.pk, one.entry.attempt)
                    if won is None:
                        one.won, one.stamp = None, now
                    else:
                        one.won = key in won
                        won.discard(key)  # of two items for one attempt in the statement, one sends
                    one.answered.set()
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


class _Senders:
    """Threads that each take the next claimed send a connector slot allows, win its start and
    send it at once; the outcome goes to the recorder.

    The dispatcher's thread only keeps the shared list of claimed sends (``waiting``) filled; a
    sender that finishes takes its next send itself, without waiting for that thread.
    """

    clock = staticmethod(time.monotonic)  # paces connectors with a rate; tests move it

    def __init__(self, size: int, per_connector: int, stop: threading.Event, recorder: _Recorder):
        self.per_connector = per_connector
        self.stop = stop
        self.recorder = recorder
        self.starts = _Starts()
        self.lock = threading.Lock()
        self.work = threading.Condition(self.lock)  # senders wait here for a send they may take
        self.room = threading.Condition(self.lock)  # the dispatcher waits here for room to claim
        self.waiting: deque[_Entry] = deque()
        self.in_flight: Counter[int] = Counter()
        self.next_due: dict[int, float] = {}  # connector -> when its next send is due (monotonic)
        self.pace_wait: float | None = None
        self.halted = False  # the dispatcher stops: take nothing more
        self.closing = False
        self.low_water = (HELD_POOLS - CLAIM_POOLS - 1) * size  # below this, there is room to claim
        self.threads = [
            threading.Thread(target=self._run, name=f"send-{n}", daemon=True) for n in range(size)
        ]
        for thread in self.threads:
            thread.start()

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
                # Evenly spaced: the next one is due an interval after this one was due, so a sender
                # waking late keeps the schedule; after an idle spell, one send of catch-up at most.
                self.next_due[connector.pk] = (
                    max(due, now - 1 / connector.max_per_s) + 1 / connector.max_per_s
                )
            del self.waiting[index]
            self.in_flight[connector.pk] += 1
            if len(self.waiting) < self.low_water:
                self.room.notify()
            return entry
        return None

    def _run(self) -> None:
        try:
            while True:
                with self.lock:
                    while (entry := self._take()) is None:
                        if self.closing:
                            return
                        self.work.wait(self.pace_wait)  # woken by a change, or when a paced send is due
                started = timezone.now()
                won = self.starts.start(entry, started)
                sent: Sent | Unstarted | None = won if isinstance(won, Unstarted) else None
                if won is True:
                    outcome = adapters.send(entry.command)  # never raises: a bug is an outcome too
                    sent = Sent(entry.command, entry.attempt, started, timezone.now(), outcome)
                # None: not ours to send; the recorder finishes the item and counts it stale.
                self.recorder.hand(entry, sent)
                with self.lock:
                    self.in_flight[entry.command.connector_id] -= 1
                    if self.waiting:
                        self.work.notify()  # a send of this connector may have been waiting for it
                    if not self.in_flight.total():
                        self.room.notify()
        finally:
            connections.close_all()

    def close(self) -> None:
        with self.lock:
            self.closing = True
            self.work.notify_all()
        for thread in self.threads:
            thread.join()
        self.starts.close()  # after the senders: none asks any more
