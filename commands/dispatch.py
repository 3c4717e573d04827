"""The dispatch loop: sweep, consume, recover — one round, run by ``manage.py dispatch`` or Celery.

* **sweep** — every due command (``approved``, or ``failed`` and due) goes through
  ``retry.decide``. Taken: ``→ queued`` by a conditional update and one item on the ``commands``
  queue. Skipped: the reason is written on the command and it stays where it is; a reason only a
  person can change (``never``, ``not-idempotent``, ...) parks it outside the sweep's query.
* **consume** — claim items and hand them to a bounded pool of sender threads
  (``ANKUSA_DISPATCH_CONCURRENCY``, at most ``ANKUSA_DISPATCH_PER_CONNECTOR`` per connector),
  because a send waits on the receiver, not on us. A sender wins ``queued → dispatching`` for the
  attempt number the sweep gave the command (one conditional UPDATE) and sends at once; a recorder
  thread writes each batch of outcomes — attempt rows, next states, queue items done — in one
  transaction.
* **recover** — a command still ``dispatching`` longer than the visibility timeout lost its worker
  (the system check E002 keeps a live send shorter than that): it becomes ``failed`` with **no**
  outlook, because nobody knows whether it went out, so a non-idempotent connector is never sent
  twice by the machine. Queue items claimed that long ago go back to the queue. A command
  ``queued`` with no item left (lost between its commit and its enqueue) gets a new item.

Why nothing is ever sent twice by the loop: a send happens only after winning
``queued → dispatching`` for attempt *n*, and a command reaches ``queued`` for attempt *n* only
through one decision. A stale or duplicate queue item finds the command no longer ``queued`` at
attempt *n − 1* and is dropped. Several dispatch processes (or Celery workers) can therefore run at
once, and an item handed out twice costs a no-op, not a second send.

What is not guaranteed: the per-connector cap is per process (N processes send up to N × the cap
to one receiver); a command whose worker dies mid-send waits for a person even if the receiver
never saw it — that is the price of never sending a non-idempotent command twice.
"""

from __future__ import annotations

import logging
import queue as stdlib_queue
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, connections, transaction
from django.utils import timezone

from commands import adapters, retry
from commands.models import Attempt, Command, Connector
from commands.states import Event, State, dispatchable, next_state
from queues.fifo import Item, ReliableFIFO, get_queue

logger = logging.getLogger("ankusa.commands.dispatch")

QUEUE_NAME = "commands"
WORKER_LOST = "WorkerLost"
WORKER_LOST_DETAIL = "the dispatch worker stopped during the send; whether it went out is unknown"
# How long the consume loop waits for a send to finish before it looks at the stop flag again.
POLL_S = 0.2


def commands_queue() -> ReliableFIFO:
    return get_queue(QUEUE_NAME)


def item_payload(command_id: int, attempt: int) -> dict:
    """What a queue item carries: the command and the attempt number the sweep decided on."""
    return {"command": command_id, "attempt": attempt}


def with_commit(queue: ReliableFIFO, write: Callable[[], object]) -> None:
    """Run a queue write as part of the surrounding transaction.

    The database queue joins the transaction, so a command's state change and its queue item
    commit together. Any other backend is written after the commit, so no worker sees a command
    before its state is committed; a crash in between leaves a command ``queued`` without an item
    (which :func:`recover` repairs) or a finished item still busy (a stale no-op when reclaimed).
    """
    if queue.backend == "database":
        write()
    else:
        transaction.on_commit(write)


def enqueue_with_commit(queue: ReliableFIFO, payloads: list[dict]) -> None:
    if payloads:
        with_commit(queue, lambda: queue.enqueue(*payloads))


def decide_for(row: dict, now: datetime) -> retry.Decision:
    """The retry decision for a command read as a dict (``state``, ``last_outlook``, ...)."""
    return retry.decide(
        dispatchable=dispatchable(row["state"]),
        outlook=row["last_outlook"] or None,
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        idempotent=row["connector__idempotent"],
        now=now,
    )


DECISION_FIELDS = ("id", "state", "last_outlook", "attempts", "next_attempt_at", "connector__idempotent")


# --- sweep ---------------------------------------------------------------------------------------


@dataclass
class SweepSummary:
    taken: int = 0
    skipped: Counter = field(default_factory=Counter)


def sweep(
    now: datetime | None = None, *, batch: int | None = None, queue: ReliableFIFO | None = None
) -> SweepSummary:
    """Decide on every due command: queue the taken ones, write the reason on the others.

    Each batch is read with its rows locked (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's
    write transaction serialises sweepers), so two sweepers split the due commands between them
    instead of deciding twice, and the updates can go by group rather than row by row.
    """
    now = now or timezone.now()
    batch = batch or settings.ANKUSA_DISPATCH_BATCH
    queue = queue or commands_queue()
    summary = SweepSummary()
    after = 0
    while True:
        with transaction.atomic():
            due = Command.objects.due(now).filter(id__gt=after).order_by("id")
            rows = list(
                due.select_for_update(skip_locked=True, of=("self",)).values(*DECISION_FIELDS)[:batch]
            )
            if not rows:
                return summary
            after = rows[-1]["id"]
            taken: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
            skipped: dict[str, list[int]] = defaultdict(list)
            for row in rows:
                decision = decide_for(row, now)
                if decision.take:
                    taken[row["state"], decision.next_attempt_at].append((row["id"], decision.attempt))
                else:
                    skipped[decision.skip].append(row["id"])
            payloads = []
            for (state, next_attempt_at), group in taken.items():
                ids = [pk for pk, _ in group]
                moved = Command.objects.filter(pk__in=ids).transition(
                    state,
                    Event.DISPATCH,
                    now,
                    next_attempt_at=next_attempt_at,
                    skip_reason="",
                    skip_decided_at=now,
                )
                if moved != len(ids):  # the rows are locked: anything else is a bug, so undo the batch
                    raise RuntimeError(f"sweep moved {moved} of {len(ids)} locked commands")
                payloads.extend(item_payload(pk, attempt) for pk, attempt in group)
            for reason, ids in skipped.items():
                Command.objects.filter(pk__in=ids).update(skip_reason=reason, skip_decided_at=now)
                summary.skipped[reason] += len(ids)
            summary.taken += len(payloads)
            enqueue_with_commit(queue, payloads)
        if len(rows) < batch:
            return summary


# --- consume -------------------------------------------------------------------------------------


# The loop's hottest statement, one per send: built by a queryset, update() costs about 0.5 ms of
# CPU (measured), ten times the statement itself, and the senders share one interpreter lock. It
# is the table's move queued --start--> dispatching, conditional on the attempt as any move is.
START_SQL = f"""
UPDATE {Command._meta.db_table} SET state = %s, state_changed_at = %s, attempts = %s
WHERE id = %s AND state = %s AND attempts = %s
"""


def start_send(command: Command, attempt: int, now: datetime) -> bool:
    """Win ``queued → dispatching`` for attempt ``attempt`` of ``command``; only the winner sends.

    One conditional UPDATE: a racing worker, or a stale or duplicate item, finds the command no
    longer queued at attempt ``attempt - 1`` and moves nothing.
    """
    target = next_state(State.QUEUED, Event.START)
    stamp = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        cursor.execute(START_SQL, [target.value, stamp, attempt, command.pk, State.QUEUED.value, attempt - 1])
        return cursor.rowcount == 1


@dataclass(frozen=True)
class Sent:
    """A finished send: what went out, when, and how it went."""

    command: Command
    attempt: int
    started: datetime
    finished: datetime
    outcome: adapters.Outcome


def _next_state(sent: Sent) -> tuple[str, dict]:
    """The event and the fields a finished send writes on its command."""
    outcome = sent.outcome
    if outcome.ok:
        return Event.SUCCEED, {
            "last_outlook": "",
            "last_error_class": "",
            "last_error": "",
            "next_attempt_at": None,
            "skip_reason": "",
            "skip_decided_at": None,
        }
    # Decide at once, so the failed list shows why it waits from the first moment.
    decision = decide_for(
        {
            "state": State.FAILED,
            "last_outlook": outcome.outlook,
            "attempts": sent.attempt,
            "next_attempt_at": sent.command.next_attempt_at,
            "connector__idempotent": sent.command.connector.idempotent,
        },
        sent.finished,
    )
    return Event.FAIL, {
        "last_outlook": outcome.outlook or "",
        "last_error_class": outcome.error_class,
        "last_error": outcome.detail,
        "skip_reason": decision.skip or "",
        "skip_decided_at": sent.finished,
    }


def record_outcomes(
    sent: list[Sent], now: datetime, *, queue: ReliableFIFO | None = None, items: tuple[Item, ...] = ()
) -> Counter:
    """Write the attempt rows and the next states of finished sends, and finish their queue items,
    in one transaction (the items after it on a queue outside the database). Returns a count of
    the states reached.

    Attempt rows are written once, complete; a send that never reports back gets its row from
    :func:`recover` instead. Commands whose changes are identical (every success of one attempt
    number, say) move in one UPDATE.
    """
    try:
        return _record(sent, now, queue, items, together=True)
    except _Recovered:
        return _record(sent, now, queue, items, together=False)


class _Recovered(Exception):
    """A group of finished sends did not move whole: some were recovered while in flight."""


def _record(sent: list[Sent], now: datetime, queue, items, *, together: bool) -> Counter:
    results: Counter = Counter()
    groups: dict[tuple, list[Sent]] = defaultdict(list)
    for one in sent:
        event, changes = _next_state(one)
        groups[event, one.attempt, tuple(sorted(changes.items()))].append(one)
    with transaction.atomic():
        recorded: list[Sent] = []
        for (event, attempt, changes), group in groups.items():
            dispatching = Command.objects.filter(state=State.DISPATCHING, attempts=attempt)
            if together:
                # Only recover() competes for a dispatching row, and only after the visibility
                # timeout: the group moves whole, or the batch is redone row by row.
                ids = [one.command.pk for one in group]
                if dispatching.filter(pk__in=ids).transition(
                    State.DISPATCHING, event, now, **dict(changes)
                ) != len(ids):
                    raise _Recovered
                recorded.extend(group)
                continue
            for one in group:
                if dispatching.filter(pk=one.command.pk).transition(
                    State.DISPATCHING, event, now, **dict(changes)
                ):
                    recorded.append(one)
                else:
                    # Only possible when a send outlives the visibility timeout, which check E002 rules out.
                    logger.warning(
                        "command %s was recovered while attempt %s was in flight", one.command.pk, attempt
                    )
                    results["stale"] += 1
        Attempt.objects.bulk_create(
            Attempt(
                command=one.command,
                number=one.attempt,
                started_at=one.started,
                finished_at=one.finished,
                ok=one.outcome.ok,
                outlook=one.outcome.outlook or "",
                status_code=one.outcome.status,
                error_class=one.outcome.error_class,
                error_message=one.outcome.detail if not one.outcome.ok else "",
                response_excerpt=one.outcome.excerpt,
            )
            for one in recorded
        )
        results.update(State.SUCCEEDED.value if one.outcome.ok else State.FAILED.value for one in recorded)
        if items:
            with_commit(queue, lambda: queue.done(*items))
    return results


@dataclass
class DrainSummary:
    claimed: int = 0
    results: Counter = field(default_factory=Counter)


@dataclass(frozen=True)
class _Entry:
    item: Item
    command: Command
    attempt: int


class _Senders:
    """Threads that each win ``queued → dispatching`` for one command and send it at once; the
    outcome goes to the recorder, and the slot is freed."""

    def __init__(self, size: int, recorder: _Recorder):
        self.recorder = recorder
        self.tasks: stdlib_queue.SimpleQueue = stdlib_queue.SimpleQueue()
        self.freed: stdlib_queue.SimpleQueue = stdlib_queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._run, name=f"send-{n}", daemon=True) for n in range(size)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        try:
            while (entry := self.tasks.get()) is not None:
                self.recorder.inbox.put((entry, self._send(entry)))
                self.freed.put(entry)
        finally:
            connections.close_all()

    def _send(self, entry: _Entry) -> Sent | None:
        """The finished send, or None when the command was not ours to send (stale, or an error)."""
        started = timezone.now()
        try:
            if not start_send(entry.command, entry.attempt, started):
                return None
        except Exception:
            # The item stays busy and comes back once its claim expires; nothing was sent.
            logger.exception("starting command %s failed", entry.command.pk)
            connections.close_all()
            return None
        outcome = adapters.send(entry.command)  # never raises: a bug is an outcome too
        return Sent(entry.command, entry.attempt, started, timezone.now(), outcome)

    def close(self) -> None:
        for _ in self.threads:
            self.tasks.put(None)
        for thread in self.threads:
            thread.join()


class _Recorder:
    """One thread that writes finished sends in batches (``record_outcomes``), while the
    dispatcher's own thread goes on claiming and starting: the two database paths overlap."""

    def __init__(self, queue: ReliableFIFO):
        self.queue = queue
        self.inbox: stdlib_queue.Queue = stdlib_queue.Queue()
        self.results: Counter = Counter()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="record", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                batch = [self.inbox.get()]
                while True:
                    try:
                        batch.append(self.inbox.get_nowait())
                    except stdlib_queue.Empty:
                        break
                finished = [task for task in batch if task is not None]
                if finished:
                    sent = [one for _, one in finished if one is not None]
                    try:
                        counts = record_outcomes(
                            sent,
                            timezone.now(),
                            queue=self.queue,
                            items=tuple(entry.item for entry, _ in finished),
                        )
                        if len(sent) < len(finished):
                            counts["stale"] += len(finished) - len(sent)
                    except Exception:
                        # The items stay busy; recover() settles their commands once the claims
                        # expire. A broken connection is dropped so the next batch reconnects.
                        logger.exception("recording %s finished sends failed", len(finished))
                        counts = Counter({"error": len(finished)})
                        connections.close_all()
                    with self.lock:
                        self.results.update(counts)
                for _ in batch:
                    self.inbox.task_done()
                if len(finished) < len(batch):
                    return
        finally:
            connections.close_all()

    def take_results(self) -> Counter:
        """Wait until everything handed over is written; returns the counts since the last call."""
        self.inbox.join()
        with self.lock:
            results, self.results = self.results, Counter()
        return results

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join()


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
        self._connectors: dict[int, Connector] = {}

    def close(self) -> None:
        if self._senders is not None:
            self._senders.close()
            self._senders.recorder.close()
            self._senders = None

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
        commands = Command.objects.in_bulk([item.payload["command"] for item in wanted])
        missing = {command.connector_id for command in commands.values()} - self._connectors.keys()
        self._connectors.update(Connector.objects.in_bulk(missing))
        for command in commands.values():
            command.connector = self._connectors[command.connector_id]
        entries, gone = [], []
        for item in wanted:
            command = commands.get(item.payload["command"])
            if command is None:
                gone.append(item)  # the command was deleted: nothing to send
            else:
                entries.append(_Entry(item, command, item.payload["attempt"]))
        if gone:
            self.queue.done(*gone)
        return entries

    def drain(self, *, max_items: int | None = None, max_seconds: float | None = None) -> DrainSummary:
        """Claim and send until the queue is empty, a limit is reached, or ``stop`` is set.

        On stop it claims nothing more, finishes and records the sends in flight, and puts the
        items it holds but has not started back at the head of the queue.
        """
        if self._senders is None:
            self._senders = _Senders(self.concurrency, _Recorder(self.queue))
        # Connectors are read once per drain and shared by their commands: a drain lasts a round
        # (or a Celery task), so a saved connector is seen from the next one on.
        self._connectors.clear()
        summary = DrainSummary()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        waiting: deque[_Entry] = deque()
        in_flight: Counter[int] = Counter()
        exhausted = False
        while True:
            stopping = (
                self.stop.is_set()
                or (deadline is not None and time.monotonic() >= deadline)
                or (max_items is not None and summary.claimed >= max_items)
            )
            # Hold up to two pools' worth: sends in flight plus as many waiting for a free thread,
            # and claim a pool's worth at a time, so claims come in batches rather than one per
            # finished send. An item waits at most a few sends — far inside the visibility timeout.
            room = 2 * self.concurrency - in_flight.total() - len(waiting)
            if max_items is not None:
                room = min(room, max_items - summary.claimed)
            if not stopping and not exhausted and room > 0 and (room >= self.concurrency or not waiting):
                want = min(self.batch, room)
                items = self.queue.claim(want)
                summary.claimed += len(items)
                exhausted = len(items) < want
                waiting.extend(self._entries(items))
            if stopping and waiting:
                self.queue.unclaim(*(entry.item for entry in waiting))
                waiting.clear()
            self._start(waiting, in_flight)
            if not in_flight.total():
                if stopping or (exhausted and not waiting):
                    summary.results.update(self._senders.recorder.take_results())
                    return summary
                continue
            try:
                freed = [self._senders.freed.get(timeout=POLL_S)]
            except stdlib_queue.Empty:
                continue
            while True:
                try:
                    freed.append(self._senders.freed.get_nowait())
                except stdlib_queue.Empty:
                    break
            for entry in freed:
                in_flight[entry.command.connector_id] -= 1

    def _start(self, waiting: deque[_Entry], in_flight: Counter[int]) -> None:
        """Hand the waiting sends that a free thread and a free connector slot allow to the senders.

        A sender wins ``queued → dispatching`` and sends at once, so a process killed at any
        moment leaves as "unknown" only commands that were being sent, or had been and were
        waiting for the recorder — never one that had not left yet.
        """
        for entry in list(waiting):
            if in_flight.total() >= self.concurrency:
                return
            if in_flight[entry.command.connector_id] < self.per_connector:
                waiting.remove(entry)
                in_flight[entry.command.connector_id] += 1
                self._senders.tasks.put(entry)


# --- recover -------------------------------------------------------------------------------------


@dataclass
class RecoverSummary:
    worker_lost: int = 0
    items_requeued: int = 0
    lost_requeued: int = 0


def recover(now: datetime | None = None, *, queue: ReliableFIFO | None = None) -> RecoverSummary:
    """Settle what dead workers left behind (see the module docstring)."""
    now = now or timezone.now()
    queue = queue or commands_queue()
    visibility = timedelta(seconds=settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S)
    summary = RecoverSummary()

    abandoned = Command.objects.filter(state=State.DISPATCHING, state_changed_at__lt=now - visibility)
    for row in abandoned.values(*DECISION_FIELDS, "state_changed_at"):
        decision = decide_for({**row, "state": State.FAILED, "last_outlook": None}, now)
        with transaction.atomic():
            moved = Command.objects.filter(
                pk=row["id"], attempts=row["attempts"], state_changed_at=row["state_changed_at"]
            ).transition(
                State.DISPATCHING,
                Event.FAIL,
                now,
                last_outlook="",
                last_error_class=WORKER_LOST,
                last_error=WORKER_LOST_DETAIL,
                skip_reason=decision.skip or "",
                skip_decided_at=now,
            )
            if moved:
                Attempt.objects.create(
                    command_id=row["id"],
                    number=row["attempts"],
                    started_at=row["state_changed_at"],
                    finished_at=now,
                    error_class=WORKER_LOST,
                    error_message=WORKER_LOST_DETAIL,
                )
                summary.worker_lost += 1

    summary.items_requeued = len(queue.handle_expired(visibility, action="requeue"))

    # A queued command whose item would have been claimed by now, had it one: claims are strictly
    # FIFO, so its item would be older than the oldest one still waiting. The visibility timeout
    # is the slack between a state change and its enqueue (a commit apart, normally milliseconds).
    cutoff = now - visibility - (queue.age("main") or timedelta(0))
    lost = Command.objects.filter(state=State.QUEUED, state_changed_at__lt=cutoff)
    for row in lost.values("id", "attempts", "state_changed_at"):
        with transaction.atomic():
            # Touching state_changed_at keeps the next round from enqueuing it again.
            if Command.objects.filter(
                pk=row["id"], state=State.QUEUED, state_changed_at=row["state_changed_at"]
            ).update(state_changed_at=now):
                enqueue_with_commit(queue, [item_payload(row["id"], row["attempts"] + 1)])
                summary.lost_requeued += 1
    return summary


# --- one round -----------------------------------------------------------------------------------


@dataclass
class RoundSummary:
    recovered: RecoverSummary
    swept: SweepSummary
    drained: DrainSummary
    seconds: float

    def line(self) -> str:
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.swept.skipped.items())) or "none"
        results = ", ".join(f"{n} {result}" for result, n in sorted(self.drained.results.items())) or "none"
        r = self.recovered
        return (
            f"dispatch round: took {self.swept.taken}, skipped {skipped}; "
            f"claimed {self.drained.claimed}: {results}; "
            f"recovered {r.worker_lost} lost sends, {r.items_requeued} expired items, {r.lost_requeued} lost items; "
            f"{self.seconds:.2f} s"
        )


def run_round(dispatcher: Dispatcher, *, max_seconds: float | None = None) -> RoundSummary:
    """Recover, sweep, then drain the queue: recovery first, so a restart resumes in one round."""
    started = time.monotonic()
    recovered = recover(queue=dispatcher.queue)
    swept = sweep(queue=dispatcher.queue)
    drained = dispatcher.drain(max_seconds=max_seconds)
    return RoundSummary(recovered, swept, drained, time.monotonic() - started)
