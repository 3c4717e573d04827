""":class:`Dispatcher`: consumes the ``commands`` queue with a bounded pool of senders and a recorder,
one per process, reused across rounds; :func:`drain_waiting` drains it between rounds when an item
waits. Guaranteed: a send goes out only after its ``queued → dispatching`` move; on stop, claimed
sends not started go back to the head of the queue.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from django.conf import settings

from commands.dispatch import hold
from commands.dispatch.recorder import _Recorder, replay_spool
from commands.dispatch.senders import _Senders
from commands.dispatch.sends import Unstarted, _Entry
from commands.dispatch.statements import load_for_sending
from commands.dispatch.timing import CLAIM_POOLS, FEED_POLL_S, HELD_POOLS, POLL_S, RECORD_PATIENCE_S
from commands.lifecycle import commands_queue
from queues.fifo import Item, ReliableFIFO


@dataclass
class DrainSummary:
    claimed: int = 0
    results: Counter = field(default_factory=Counter)

    def line(self) -> str:
        results = ", ".join(f"{n} {result}" for result, n in sorted(self.results.items())) or "none"
        return f"claimed {self.claimed}: {results}"


class Dispatcher:
    """Consumes the ``commands`` queue with a bounded pool; one per process, reused across rounds."""

    def __init__(
        self,
        *,
        concurrency: int | None = None,
        per_connector: int | None = None,
        batch: int | None = None,
        stop: threading.Event | None = None,
        queue: ReliableFIFO | None = None,
    ):
        self.concurrency = concurrency or settings.ANKUSA_DISPATCH_CONCURRENCY
        self.per_connector = per_connector or settings.ANKUSA_DISPATCH_PER_CONNECTOR
        self.batch = batch or settings.ANKUSA_DISPATCH_BATCH
        self.stop = stop or threading.Event()
        self.queue = queue or commands_queue()
        self._senders: _Senders | None = None

    def close(self) -> None:
        """Finish the sends in flight and write their outcomes (or spool them: see ``_Recorder``).
        Claimed sends not started (left by a drain that failed) go back to the queue the same way."""
        if self._senders is not None:
            self._senders.close()
            for entry in self._senders.waiting:
                self._senders.recorder.hand(entry, Unstarted())
            self._senders.waiting.clear()
            self._senders.recorder.close()
            self._senders = None

    def pending_commands(self) -> set[int]:
        """The commands whose outcome this dispatcher holds, not yet written (see ``recover``)."""
        return set() if self._senders is None else self._senders.recorder.pending_commands()

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _entries(self, items: list[Item]) -> list[_Entry]:
        """Turn claimed items into sends (one query for the batch); items naming no command end here."""
        wanted: list[Item] = []
        for item in items:
            payload = item.payload
            if (
                isinstance(payload, dict)
                and isinstance(payload.get("command"), int)
                and isinstance(payload.get("attempt"), int)
            ):
                wanted.append(item)
            else:
                self.queue.fail(item, f"not a command item: {str(payload)[:200]}")
        # Each claimed batch reads its connectors afresh (the same statement as its commands): a
        # drain under load lasts up to a round, and a pause, a hold or a fixed URL committed since
        # it began holds for every send claimed after the commit.
        commands = load_for_sending([item.payload["command"] for item in wanted])
        entries, gone = [], []
        for item in wanted:
            command = commands.get(item.payload["command"])
            if command is None:
                gone.append(item)  # the command was deleted: nothing to send
            else:
                entries.append(_Entry(item, command, item.payload["attempt"]))
        if gone:
            self.queue.done(*gone)
        return hold.set_aside(entries, self.queue)  # a paused or held connector's: not sent

    def drain(
        self,
        *,
        max_items: int | None = None,
        max_seconds: float | None = None,
        fed_until: threading.Event | None = None,
    ) -> DrainSummary:
        """Claim and send until the queue is empty, a limit is reached, or ``stop`` is set.

        With ``fed_until``, an empty queue ends the drain only once that event is set (something
        else is still queuing, such as the round's sweep): until then the drain waits for more.
        On stop it claims nothing more, finishes and records the sends in flight, and puts the
        items it holds but has not started back at the head of the queue.

        Before it claims anything it writes back the outcomes spooled on this node
        (:func:`replay_spool`); it raises if it cannot, and claims nothing then.
        """
        replay_spool(self.queue)
        if self._senders is None:
            self._senders = _Senders(self.concurrency, self.per_connector, self.stop, _Recorder(self.queue))
        senders = self._senders
        summary = DrainSummary()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        exhausted = False
        claimed_at = 0.0  # when the last claim was made (monotonic)
        with senders.lock:
            senders.halted = False
        while True:
            stopping = (
                self.stop.is_set()
                or (deadline is not None and time.monotonic() >= deadline)
                or (max_items is not None and summary.claimed >= max_items)
            )
            with senders.lock:
                back = list(senders.waiting) if stopping else []
                if stopping:
                    senders.halted = True
                    senders.waiting.clear()
                waiting = len(senders.waiting)
                held = senders.in_flight.total() + waiting
            # Claimed, never started: the recorder puts their items back at the head of the queue
            # (or, while the queue's database is down, once it answers, or spools them on close),
            # and the wait for its results below waits for that too.
            for entry in back:
                senders.recorder.hand(entry, Unstarted())
            # Hold up to four pools' worth (sends in flight and claimed sends waiting for a thread)
            # and claim two at a time once there is room for them, while a pool still waits: a
            # sender never waits for a claim, and each claim (two round trips, and the loading of
            # its commands) is shared by many sends. An item waits a few sends at most, far inside
            # the visibility timeout.
            room = HELD_POOLS * self.concurrency - held
            if max_items is not None:
                room = min(room, max_items - summary.claimed)
            claim_at = CLAIM_POOLS * self.concurrency
            if senders.starts.failures and summary.claimed:
                # Starts fail (senders._Starts paces its tries): the items they put back wait for
                # the loop's next drain rather than be claimed again at once.
                exhausted = True
            if not stopping and not exhausted and room > 0 and (room >= claim_at or not waiting):
                want = min(self.batch, room)
                # Read before the claim: once it is set, everything fed is committed and claimable.
                fed = fed_until is None or fed_until.is_set()
                items = self.queue.claim(want)
                claimed_at = time.monotonic()
                summary.claimed += len(items)
                exhausted = len(items) < want and fed
                if not items and not fed:
                    fed_until.wait(FEED_POLL_S)
                    continue
                try:
                    entries = self._entries(items)
                except Exception:
                    # The database is down while the queue is not: the items go back at once,
                    # rather than wait out the visibility timeout in busy.
                    with contextlib.suppress(Exception):
                        self.queue.unclaim(*items)
                    raise
                with senders.lock:
                    senders.waiting.extend(entries)
                    senders.work.notify(len(entries))
                continue
            with senders.lock:
                idle = not senders.waiting and not senders.in_flight.total()
                if stopping or not exhausted:
                    if stopping and idle:
                        break
                    senders.room.wait(POLL_S)
                    continue
            # The queue looked empty. A drain keeps claiming while work is queued, rather than end
            # and leave the new work for the loop's next one — also while the recorder is still
            # writing outcomes (under load it lags the sends by seconds; waiting for it without
            # claiming is where commands queued meanwhile waited seconds, issue 23). A wake since
            # (queues.wake; a look, never a wait) sends it back to claim at once; else it claims
            # again every FEED_POLL_S while anything is in flight or recording: a drain at work
            # does not sleep, so on PostgreSQL commits queue without waking it (waking would make
            # every commit take its turn). A recorder that fails (the database is down) is left to
            # take_results' patience below.
            recording = senders.recorder.unsettled and not senders.recorder.failures
            if self.queue.wait_for_work(0):
                exhausted = False
            elif idle and not recording:
                break  # the loop's wait looks at the queue before it sleeps: nothing is left behind
            else:
                left = claimed_at + FEED_POLL_S - time.monotonic()
                if left > 0 or senders.starts.failures:
                    with senders.lock:
                        senders.room.wait(left if left > 0 else FEED_POLL_S)
                else:
                    exhausted = False
        # Wait for the outcomes to be written; while the database refuses them, a stopping
        # dispatcher leaves them to close() (which spools them), and a drain with a deadline
        # waits a while past it, not for the whole outage.
        patience = None if deadline is None else deadline + RECORD_PATIENCE_S
        recorder = senders.recorder

        def give_up() -> bool:
            if patience is not None and time.monotonic() >= patience:
                return True
            return self.stop.is_set() and recorder.failures > 0

        summary.results.update(recorder.take_results(give_up))
        return summary


def items_waiting(queue: ReliableFIFO) -> bool:
    """Whether an item waits on ``queue``: one read of its head. What lets the loop between rounds,
    and Celery beat, look for the commands intake queued itself often without starting a drain."""
    return bool(queue.peek("main", 1))


@dataclass
class PollSummary:
    """A drain between rounds, of what was queued since the last one (by intake, mostly)."""

    drained: DrainSummary
    seconds: float

    def line(self) -> str:
        return f"dispatch drain: {self.drained.line()}; {self.seconds:.2f} s"


def drain_waiting(dispatcher: Dispatcher, *, max_seconds: float | None = None) -> PollSummary | None:
    """Drain the queue if an item waits on it; None (and no drain started) if none does."""
    if not items_waiting(dispatcher.queue):
        return None
    started = time.monotonic()
    drained = dispatcher.drain(max_seconds=max_seconds)
    return PollSummary(drained, time.monotonic() - started)
