"""The recorder thread: writes finished sends in batches while the dispatcher goes on claiming, keeps
each outcome until written (a failed batch is tried again, after a doubling pause), and on close
spools what it still cannot write (``commands.dispatch.spool``); :func:`replay_spool` writes a spool
back. Not guaranteed: a spool that cannot be written loses its outcomes (their commands are recovered
as ``WorkerLost``, never sent again).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable
from datetime import datetime

from django.db import connections
from django.utils import timezone

from ankusa_site.core.logs import log_event
from commands import retry
from commands.dispatch import adapters, spool
from commands.dispatch.outcomes import record_outcomes
from commands.dispatch.sends import Sent, Unstarted, _Entry
from commands.dispatch.statements import load_for_sending, undo_starts
from commands.dispatch.timing import POLL_S, RECORD_RETRY_FIRST_S, retry_delay
from commands.models import Connector
from queues.fifo import Item, ReliableFIFO

logger = logging.getLogger("ankusa.commands.dispatch")


class _Recorder:
    """One thread that writes finished sends in batches (``record_outcomes``), while the
    dispatcher's own thread goes on claiming and starting: the two database paths overlap.

    An outcome is kept until it is written: a batch that fails (the database is down) is tried
    again after a pause doubling up to ``RETRY_MAX_S``, together with what arrived meanwhile. On
    ``close`` it is tried once more, and what still cannot be written goes to the spool
    (``commands.dispatch.spool``), for the next dispatcher on this node to write back.
    """

    def __init__(self, queue: ReliableFIFO, *, pause: Callable[[int], float] | None = None):
        self.queue = queue
        # The pause after ``n`` failed writes in a row (injected by tests: no sleeping out backoffs).
        self.pause = pause or (lambda failures: retry_delay(failures, RECORD_RETRY_FIRST_S))
        self.changed = threading.Condition()
        self.inbox: list[tuple[_Entry, Sent | Unstarted | None]] = []
        self.writing: list[tuple[_Entry, Sent | Unstarted | None]] = []  # taken, not written yet
        self.unsettled = 0  # handed over and neither written nor spooled
        self.failures = 0
        self.closing = False
        self.results: Counter = Counter()
        self.thread = threading.Thread(target=self._run, name="record", daemon=True)
        self.thread.start()

    def hand(self, entry: _Entry, sent: Sent | Unstarted | None) -> None:
        """Take a finished send (``sent``), a start lost to another worker (None) or a send never
        started (``Unstarted``: its start is undone, its item goes back to the head of the queue)."""
        with self.changed:
            self.inbox.append((entry, sent))
            self.unsettled += 1
            self.changed.notify_all()

    def pending_commands(self) -> set[int]:
        """The commands whose outcome is here, not yet written: not lost, whatever their age."""
        with self.changed:
            return {
                entry.command.pk for entry, sent in (*self.writing, *self.inbox) if isinstance(sent, Sent)
            }

    def _run(self) -> None:
        try:
            while True:
                with self.changed:
                    while not self.inbox and not self.writing and not self.closing:
                        self.changed.wait()
                    if not self.inbox and not self.writing:
                        return
                    self.writing += self.inbox
                    self.inbox = []
                    batch, last_try = list(self.writing), self.closing
                counts = self._write(batch)
                if isinstance(counts, Exception):
                    # A broken connection is dropped so the next try reconnects.
                    connections.close_all()
                    self._report_failure(len(batch), counts, last_try)
                    if last_try:
                        counts = self._spool(batch)
                with self.changed:
                    if isinstance(counts, Exception):
                        self.failures += 1
                        # Woken early by close(), for the last try.
                        self.changed.wait_for(lambda: self.closing, timeout=self.pause(self.failures))
                        continue
                    self.failures = 0
                    self.writing = []
                    self.unsettled -= len(batch)
                    self.results.update(counts)
                    self.changed.notify_all()
        finally:
            connections.close_all()

    def _write(self, batch: list) -> Counter | Exception:
        """Write ``batch``; its counts, or what went wrong (it may be tried again)."""
        sent = [one for _, one in batch if isinstance(one, Sent)]
        unstarted = [(entry, one) for entry, one in batch if isinstance(one, Unstarted)]
        try:
            if unstarted:
                undo_starts([(entry.command.pk, entry.attempt, one.stamp) for entry, one in unstarted])
                self.queue.unclaim(*(entry.item for entry, _ in unstarted))
            counts = record_outcomes(
                sent,
                timezone.now(),
                queue=self.queue,
                items=tuple(entry.item for entry, one in batch if not isinstance(one, Unstarted)),
            )
        except Exception as exc:
            return exc
        counts["stale"] += len(batch) - len(sent) - len(unstarted)
        counts["unstarted"] += len(unstarted)
        return +counts

    def _report_failure(self, count: int, exc: Exception, last_try: bool) -> None:
        then = "spooling them" if last_try else "trying again"
        if not self.failures:  # the first of an outage with its traceback, the others in a line
            logger.error("recording %s finished sends failed; %s", count, then, exc_info=exc)
        else:
            logger.warning("recording %s finished sends failed again (%s); %s", count, exc, then)

    def _spool(self, batch: list) -> Counter:
        """Keep the outcomes of ``batch`` on disk, and the items of its failed starts (to go back to
        the queue at once when written back, rather than after the visibility timeout)."""
        records = [spooled(entry, one) for entry, one in batch if isinstance(one, Sent)]
        records += [
            {"item": item_record(entry.item), "unstarted": unstarted_record(entry, one)}
            for entry, one in batch
            if isinstance(one, Unstarted)
        ]
        if not records:
            return Counter()
        sent = sum(1 for record in records if "command" in record)
        try:
            path = spool.write(records)
        except Exception:
            # Nowhere to keep them (a full or read-only disk): their commands are recovered as
            # WorkerLost, never sent again.
            logger.exception("spooling %s unrecorded outcomes failed", sent)
            return Counter({"unrecorded": sent})
        log_event(logger, "outcomes_spooled", level=logging.WARNING, count=sent, file=str(path))
        return Counter({"spooled": sent})

    def take_results(self, give_up: Callable[[], bool] = lambda: False) -> Counter:
        """Wait until everything handed over is written (or spooled), or until ``give_up()`` says
        to stop waiting; returns the counts since the last call. What is not written yet stays
        here, tried again."""
        with self.changed:
            # A thread that died (a bug) settles nothing more: waiting for it would hang the loop.
            while self.unsettled and not give_up() and self.thread.is_alive():
                self.changed.wait(POLL_S)
            results, self.results = self.results, Counter()
        return results

    def close(self) -> None:
        """Write what is here, or spool it, and end the thread."""
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        self.thread.join()


def unstarted_record(entry: _Entry, one: Unstarted) -> dict:
    stamp = None if one.stamp is None else one.stamp.isoformat()
    return {"command": entry.command.pk, "attempt": entry.attempt, "stamp": stamp}


def spooled(entry: _Entry, sent: Sent) -> dict:
    """A finished send and its queue item as a spool record (JSON)."""
    return {
        "command": sent.command.pk,
        "attempt": sent.attempt,
        "started": sent.started.isoformat(),
        "finished": sent.finished.isoformat(),
        "outcome": dataclasses.asdict(sent.outcome),
        "item": item_record(entry.item),
    }


def item_record(item: Item) -> dict:
    """What a spool keeps of a claimed item: enough to finish it, or put it back, under its claim."""
    return {
        "id": item.id,
        "claims": item.claims,
        "payload": item.payload,
        "enqueued_at": item.enqueued_at.isoformat(),
    }


def replay_spool(queue: ReliableFIFO) -> Counter:
    """Write back the outcomes spooled on this node (see ``commands.dispatch.spool``); the counts of the
    states they reached. Raises when the database does not take them; the files stay."""
    results: Counter = Counter()
    for path in spool.pending():
        with spool.replaying(path) as records:
            if records is None:  # another dispatcher here is writing it back
                continue
            unstarted = [record for record in records if "unstarted" in record]
            if unstarted:
                undo_starts(
                    [
                        (
                            start["command"],
                            start["attempt"],
                            start["stamp"] and datetime.fromisoformat(start["stamp"]),
                        )
                        for start in (record["unstarted"] for record in unstarted)
                    ]
                )
                # Skipped for an item recovered and claimed since.
                queue.unclaim(*(_item(record["item"]) for record in unstarted))
            outcomes = [record for record in records if "command" in record]
            sent, items = _unspooled(outcomes)
            counts = record_outcomes(sent, timezone.now(), queue=queue, items=items)
            log_event(logger, "spool_replayed", file=path.name, outcomes=len(outcomes), **counts)
            results.update(counts)
    return results


def _item(raw: dict) -> Item:
    return Item(
        id=raw["id"],
        payload=raw["payload"],
        enqueued_at=datetime.fromisoformat(raw["enqueued_at"]),
        claims=raw["claims"],
    )


def _unspooled(records: list[dict]) -> tuple[list[Sent], tuple[Item, ...]]:
    commands = load_for_sending([record["command"] for record in records])
    connectors = Connector.objects.in_bulk({command.connector_id for command in commands.values()})
    sent, items = [], []
    for record in records:
        items.append(_item(record["item"]))
        command = commands.get(record["command"])
        if command is None:  # deleted since: nothing to write on
            continue
        command.connector = connectors[command.connector_id]
        outcome = dict(record["outcome"])
        outcome["outlook"] = retry.Outlook(outcome["outlook"]) if outcome["outlook"] else None
        sent.append(
            Sent(
                command,
                record["attempt"],
                datetime.fromisoformat(record["started"]),
                datetime.fromisoformat(record["finished"]),
                adapters.Outcome(**outcome),
            )
        )
    return sent, tuple(items)
