"""The dispatch loop: sweep, consume, recover — one round, run by ``manage.py dispatch`` or Celery.

* **sweep** — every due command (``approved``, or ``failed`` and due) goes through
  ``retry.decide``. Taken: ``→ queued`` by a conditional update and one item on the ``commands``
  queue. Skipped: the reason is written on the command and it stays where it is; a reason only a
  person can change (``never``, ``not-idempotent``, ...) parks it outside the sweep's query.
* **consume** — claim items, move the command ``queued → dispatching`` (conditional on the attempt
  number the sweep gave it) together with a new ``Attempt`` row, send it through its adapter, then
  write the outcome and the next state, and mark the item done. Sends run in a bounded pool of
  threads (``ANKUSA_DISPATCH_CONCURRENCY``) with a cap per connector
  (``ANKUSA_DISPATCH_PER_CONNECTOR``), because a send waits on the receiver, not on us.
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
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from commands import adapters, retry
from commands.models import Attempt, Command
from commands.states import Event, State, dispatchable
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


def enqueue_with_commit(queue: ReliableFIFO, payloads: list[dict]) -> None:
    """Enqueue as part of the surrounding transaction.

    The database queue joins it, so the state change and the item commit together. Any other
    backend is written after the commit, so no worker sees a command before it is queued; a
    crash in between leaves the command ``queued`` without an item, which :func:`recover` repairs.
    """
    if not payloads:
        return
    if queue.backend == "database":
        queue.enqueue(*payloads)
    else:
        transaction.on_commit(lambda: queue.enqueue(*payloads))


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


def send_command(command: Command, attempt: int) -> str:
    """Dispatch attempt ``attempt`` of ``command`` (read with its connector), if still queued for it.

    Winning ``queued → dispatching`` is one conditional UPDATE; only the winner sends. Returns
    ``"stale"`` when another worker won or the command moved on (nothing sent), else the state it
    ended in (``"succeeded"`` or ``"failed"``).
    """
    started = timezone.now()
    won = Command.objects.filter(pk=command.pk, attempts=attempt - 1).transition(
        State.QUEUED, Event.START, started, attempts=attempt
    )
    if not won:
        return "stale"
    outcome = adapters.send(command)
    return record_outcome(command, attempt, started, outcome, timezone.now())


def record_outcome(
    command: Command, attempt: int, started: datetime, outcome: adapters.Outcome, now: datetime
) -> str:
    """Write the attempt row and move the command to its next state, in one transaction.

    The row is written once, complete; a send that never reports back gets its row from
    :func:`recover` instead.
    """
    error = outcome.detail if not outcome.ok else ""
    if outcome.ok:
        event, changes = Event.SUCCEED, {"next_attempt_at": None, "skip_reason": "", "skip_decided_at": None}
    else:
        # Decide at once, so the failed list shows why it waits from the first moment.
        decision = decide_for(
            {
                "state": State.FAILED,
                "last_outlook": outcome.outlook,
                "attempts": attempt,
                "next_attempt_at": command.next_attempt_at,
                "connector__idempotent": command.connector.idempotent,
            },
            now,
        )
        event, changes = Event.FAIL, {"skip_reason": decision.skip or "", "skip_decided_at": now}
    with transaction.atomic():
        moved = Command.objects.filter(pk=command.pk, attempts=attempt).transition(
            State.DISPATCHING,
            event,
            now,
            last_outlook=outcome.outlook or "",
            last_error_class=outcome.error_class,
            last_error=error,
            **changes,
        )
        if moved:
            Attempt.objects.create(
                command=command,
                number=attempt,
                started_at=started,
                finished_at=now,
                ok=outcome.ok,
                outlook=outcome.outlook or "",
                status_code=outcome.status,
                error_class=outcome.error_class,
                error_message=error,
                response_excerpt=outcome.excerpt,
            )
    if not moved:
        # Only possible when a send outlives the visibility timeout, which check E002 rules out.
        logger.warning(
            "command %s was recovered while attempt %s was in flight; its outcome (ok=%s, %s) is dropped",
            command.pk,
            attempt,
            outcome.ok,
            outcome.error_class or outcome.status,
        )
        return "stale"
    return State.SUCCEEDED.value if outcome.ok else State.FAILED.value


@dataclass
class DrainSummary:
    claimed: int = 0
    results: Counter = field(default_factory=Counter)


@dataclass(frozen=True)
class _Entry:
    item: Item
    command: Command
    attempt: int


class _Workers:
    """A fixed set of threads running sends; each closes its own database connection when it ends."""

    def __init__(self, size: int):
        self.tasks: stdlib_queue.SimpleQueue = stdlib_queue.SimpleQueue()
        self.results: stdlib_queue.SimpleQueue = stdlib_queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._run, name=f"dispatch-{n}", daemon=True) for n in range(size)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        try:
            while (entry := self.tasks.get()) is not None:
                try:
                    result = send_command(entry.command, entry.attempt)
                except Exception:
                    # The database failed us around the send; recover() settles the command.
                    logger.exception("dispatch of command %s failed", entry.command.pk)
                    result = "error"
                self.results.put((entry, result))
        finally:
            connections.close_all()

    def close(self) -> None:
        for _ in self.threads:
            self.tasks.put(None)
        for thread in self.threads:
            thread.join()


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
        self._workers: _Workers | None = None

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()
            self._workers = None

    def __enter__(self) -> Dispatcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _entries(self, items: list[Item], finished: list[Item]) -> list[_Entry]:
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
        commands = Command.objects.select_related("connector").in_bulk(
            [item.payload["command"] for item in wanted]
        )
        entries = []
        for item in wanted:
            command = commands.get(item.payload["command"])
            if command is None:
                finished.append(item)  # the command is gone: nothing to send
            else:
                entries.append(_Entry(item, command, item.payload["attempt"]))
        return entries

    def drain(self, *, max_items: int | None = None, max_seconds: float | None = None) -> DrainSummary:
        """Claim and send until the queue is empty, a limit is reached, or ``stop`` is set.

        On stop it claims nothing more, finishes the sends in flight and puts the items it holds
        but has not started back at the head of the queue.
        """
        if self._workers is None:
            self._workers = _Workers(self.concurrency)
        summary = DrainSummary()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        waiting: deque[_Entry] = deque()
        in_flight: Counter[int] = Counter()
        finished: list[Item] = []
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
                waiting.extend(self._entries(items, finished))
            if stopping and waiting:
                self.queue.unclaim(*(entry.item for entry in waiting))
                waiting.clear()
            for entry in list(waiting):
                if in_flight[entry.command.connector_id] < self.per_connector:
                    waiting.remove(entry)
                    in_flight[entry.command.connector_id] += 1
                    self._workers.tasks.put(entry)
            if finished:
                self.queue.done(*finished)
                finished.clear()
            if not in_flight.total():
                if stopping or (exhausted and not waiting):
                    return summary
                continue
            try:
                results = [self._workers.results.get(timeout=POLL_S)]
            except stdlib_queue.Empty:
                continue
            while True:
                try:
                    results.append(self._workers.results.get_nowait())
                except stdlib_queue.Empty:
                    break
            for entry, result in results:
                in_flight[entry.command.connector_id] -= 1
                summary.results[result] += 1
                finished.append(entry.item)


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
