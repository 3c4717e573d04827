"""The dispatch loop: sweep, drain, recover — run by ``manage.py dispatch`` or Celery.

* **sweep** — due commands go through ``retry.decide``: taken, ``→ queued`` with one item on the
  ``commands`` queue; skipped, the reason is written on the command.
* **drain** — sender threads (``ANKUSA_DISPATCH_CONCURRENCY``, at most a connector's
  ``max_in_flight`` or ``ANKUSA_DISPATCH_PER_CONNECTOR`` per connector) each win ``queued →
  dispatching`` for the attempt the sweep decided (one thread makes the starts asked for meanwhile)
  and send at once; a recorder thread writes each batch of outcomes in one transaction, keeping
  them (or spooling them, ``commands.spool``) until written. Senders never touch the database: a
  process holds a few connections however many sends are in flight.
* **recover** — a command ``dispatching`` past the visibility timeout becomes ``failed`` with no
  outlook; expired items go back to the queue; a ``queued`` command with no item gets one.

Guaranteed: the loop never sends a command twice by itself (a send needs the ``queued →
dispatching`` move for that attempt; a stale or duplicate item finds it gone), with any number of
loops or Celery workers at once. Not guaranteed: the per-connector cap is per process (N processes
send up to N × the cap to one receiver); a command whose worker dies mid-send, or whose outcome
dies with its process or its disk, waits for a person even if the receiver never saw it — the
price of never sending a non-idempotent command twice. The whole account: docs/design.md, *The
dispatch loop*.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import F
from django.utils import timezone

from ankusa_site.core import metrics
from ankusa_site.core.logs import log_event
from ankusa_site.core.prepared import execute_prepared
from ankusa_site.core.stock import stock
from commands import adapters, heartbeat, retry, spool
from commands.models import Attempt, Command, Connector
from commands.states import Event, State, dispatchable, next_state
from queues.backends import get_queue
from queues.fifo import Item, ReliableFIFO

logger = logging.getLogger("ankusa.commands.dispatch")

QUEUE_NAME = "commands"
WORKER_LOST = "WorkerLost"
WORKER_LOST_DETAIL = "the dispatch worker stopped during the send; whether it went out is unknown"
# How long the consume loop waits for a send to finish before it looks at the stop flag again.
POLL_S = 0.2
# Claimed sends a dispatcher holds, and claims at a time, in pools (ANKUSA_DISPATCH_CONCURRENCY).
HELD_POOLS = 4
CLAIM_POOLS = 2
# How often a drain fed by the round's sweep looks for items again when it finds none: a sweep
# batch takes about as long to decide and commit.
FEED_POLL_S = 0.01
# After a failed write of outcomes (the database is down), the recorder tries again after this
# pause, doubling up to RETRY_MAX_S: a database back from a restart is written to within it, and
# an outage costs a log line per try rather than a spin. The loop's own retries share the cap.
RECORD_RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0
# How long a drain with a deadline (a Celery task) waits past it for its outcomes to be written
# before it ends anyway; its dispatcher keeps trying them, and spools them when it closes.
RECORD_PATIENCE_S = 10.0


def retry_delay(failures: int, first: float, cap: float = RETRY_MAX_S) -> float:
    """The pause before the next try after ``failures`` failed tries in a row: ``first`` doubling,
    at most ``cap`` (or ``first``, if that is longer)."""
    return min(first * 2 ** max(failures - 1, 0), max(cap, first))


def commands_queue() -> ReliableFIFO:
    return get_queue(QUEUE_NAME)


def item_payload(command_id: int, attempt: int) -> dict:
    """What a queue item carries: the command and the attempt number the sweep decided on."""
    return {"command": command_id, "attempt": attempt}


def with_commit(queue: ReliableFIFO, write: Callable[[], object]) -> None:
    """Run a queue write as part of the surrounding transaction (``ReliableFIFO.on_commit``).

    A queue that joins the transaction commits a command's state change and its queue item
    together. Any other is written after the commit, so no worker sees a command before its state
    is committed; a crash in between leaves a command ``queued`` without an item (which
    :func:`recover` repairs) or a finished item still busy (a stale no-op when reclaimed).
    """
    queue.on_commit(write)


def enqueue_with_commit(queue: ReliableFIFO, payloads: list[dict]) -> None:
    queue.enqueue_on_commit(*payloads)


def decide_for(row: dict, now: datetime) -> retry.Decision:
    """The retry decision for a command read as a dict (``state``, ``last_outlook``, ...).

    A failed command a person resent (``resend_by``, see ``commands.actions``) is taken whatever the
    decision would say: the person decided. Once — the send's outcome clears the mark.
    """
    if row.get("resend_by") is not None and row["state"] == State.FAILED:
        return retry.Decision(
            take=True, attempt=row["attempts"] + 1, next_attempt_at=now + retry.AGAIN_BACKOFF[0]
        )
    return retry.decide(
        dispatchable=dispatchable(row["state"]),
        outlook=row["last_outlook"] or None,
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        idempotent=row["connector__idempotent"],
        now=now,
    )


DECISION_FIELDS = (
    "id",
    "state",
    "last_outlook",
    "attempts",
    "next_attempt_at",
    "connector__idempotent",
    "resend_by",
)


# --- sweep ---------------------------------------------------------------------------------------


@dataclass
class SweepSummary:
    taken: int = 0
    skipped: Counter = field(default_factory=Counter)


def sweep(
    now: datetime | None = None,
    *,
    batch: int | None = None,
    queue: ReliableFIFO | None = None,
    connector: int | None = None,
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
            if connector is not None:  # a saved connector's commands (commands.actions.reconsider)
                due = due.filter(connector_id=connector)
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
                # Once per decision: a parked reason leaves the command out of later sweeps.
                log_event(logger, "skipped", reason=reason, count=len(ids), commands=ids[:20])
            summary.taken += len(payloads)
            enqueue_with_commit(queue, payloads)
        if len(rows) < batch:
            return summary


# --- consume -------------------------------------------------------------------------------------


# The move queued --start--> dispatching for the sends that senders ask to start together, each
# conditional on its attempt: one statement that keeps only the commands still queued at the
# attempt before, and whose RETURNING names the winners. Built by a queryset, one start per send
# cost about 0.3 ms of CPU in a process whose threads share one interpreter lock (measured), a
# fifth of a command's whole budget. PostgreSQL gets the pairs as two arrays, so the text is the
# same for any number of them and the server keeps it prepared (``ankusa_site.core.prepared``);
# elsewhere a row-value test (SQLite >= 3.35 has row values and RETURNING).
#
# On PostgreSQL the hot statements on commands find their rows by primary key whatever the
# statistics say (:func:`by_key`).
def by_key(table: str, pairs: str, test: str) -> str:
    """PostgreSQL: the row versions (``ctid``) of ``table`` that ``pairs`` (a table expression
    whose rows are called ``wanted``, with an ``id``) name and that pass ``test`` (over ``found``,
    the row, and ``wanted``), as an array for ``WHERE ctid = ANY(...)``.

    One primary-key lookup per wanted row, whatever the statistics say: each is a subquery of its
    own (a plan can only run it per row), and ``test`` must not match a partial index (write a
    state test as ``(found.state || '') = …``), which leaves the primary key its only index. With
    statistics gathered on an empty table, a join would walk the whole table, or a partial index
    (the in-flight commands', the busy items') estimated at one row, for each statement. The
    write then reads each row by its version (a TID scan); a row another transaction changed
    meanwhile has a new version, so the write skips it, as a failed test would.
    """
    return (
        f"ARRAY(SELECT (SELECT found.ctid FROM {table} AS found WHERE found.id = wanted.id AND {test})"
        f" FROM {pairs})"
    )


START_SQL_POSTGRESQL = f"""
UPDATE {Command._meta.db_table} AS command
SET state = %s, state_changed_at = %s, attempts = command.attempts + 1
WHERE command.ctid = ANY({
    by_key(
        Command._meta.db_table,
        "unnest(%s::bigint[], %s::integer[]) AS wanted(id, attempt)",
        "(found.state || '') = %s AND found.attempts = wanted.attempt - 1",
    )
})
RETURNING command.id, command.attempts
"""
START_SQL = f"""
UPDATE {Command._meta.db_table} SET state = %s, state_changed_at = %s, attempts = attempts + 1
WHERE id IN ({{ids}}) AND state = %s AND (id, attempts) IN (VALUES {{tokens}})
RETURNING id, attempts
"""


def start_sends(wanted: list[tuple[int, int]], now: datetime) -> set[tuple[int, int]]:
    """Win ``queued → dispatching`` for each ``(command id, attempt)``; only a winner may send.

    Returns the pairs won. A racing worker, or a stale or duplicate item, finds its command no
    longer queued at ``attempt - 1`` and wins nothing; of two entries for one command in the same
    call, one at most wins (a row is updated once per statement).
    """
    target = next_state(State.QUEUED, Event.START).value
    queued = State.QUEUED.value
    if stock("sql"):  # ANKUSA_STOCK_DJANGO: the ORM's conditional updates this stands for
        won = set()
        with transaction.atomic():
            for pk, attempt in wanted:
                rows = Command.objects.filter(pk=pk, state=queued, attempts=attempt - 1)
                if rows.update(state=target, state_changed_at=now, attempts=F("attempts") + 1):
                    won.add((pk, attempt))
        return won
    if connection.vendor == "postgresql":
        ids, attempts = [pk for pk, _ in wanted], [attempt for _, attempt in wanted]
        rows, _ = execute_prepared(connection, START_SQL_POSTGRESQL, [target, now, queued, ids, attempts])
        return set(rows)
    params = [target, connection.ops.adapt_datetimefield_value(now), *(pk for pk, _ in wanted), queued]
    params += [value for pk, attempt in wanted for value in (pk, attempt - 1)]
    sql = START_SQL.format(ids=", ".join(["%s"] * len(wanted)), tokens=", ".join(["(%s, %s)"] * len(wanted)))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return set(cursor.fetchall())


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
            "resend_by": None,
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
    # A resend is spent by its send: another failure waits for a person again.
    return Event.FAIL, {
        "resend_by": None,
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


def finish_sends(ids: list[int], attempt: int, event: str, now: datetime, changes: dict) -> int:
    """Move the commands ``ids`` still ``dispatching`` attempt ``attempt`` by ``event``, writing
    ``changes``; returns how many moved, for the caller to check.

    The conditional UPDATE of ``CommandQuerySet.transition``, with the target from the same table,
    written out because the ORM's compilation of it costs about 1 ms of CPU per batch (measured).
    """
    if stock("sql"):  # ANKUSA_STOCK_DJANGO: the ORM's conditional update this stands for
        rows = Command.objects.filter(pk__in=ids, state=State.DISPATCHING, attempts=attempt)
        return rows.update(state=next_state(State.DISPATCHING, event), state_changed_at=now, **changes)
    sql, params = finish_statement(ids, attempt, event, now, changes, connection)
    if connection.vendor == "postgresql":
        return execute_prepared(connection, sql, params)[1]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def finish_statement(
    ids: list[int], attempt: int, event: str, now: datetime, changes: dict, db
) -> tuple[str, list]:
    """The SQL of :func:`finish_sends` on the connection ``db``, and its parameters."""
    target = next_state(State.DISPATCHING, event)
    fields = [Command._meta.get_field(name) for name in changes]
    assignments = "".join(f", {db.ops.quote_name(field.column)} = %s" for field in fields)
    params = [target.value, db.ops.adapt_datetimefield_value(now)]
    params += [field.get_db_prep_save(changes[field.name], db) for field in fields]
    update = f"UPDATE {Command._meta.db_table} SET state = %s, state_changed_at = %s{assignments} "
    if db.vendor == "postgresql":
        # The ids as one array: the same text for any count (one per kind of change), kept prepared,
        # each looked up by primary key (by_key).
        found = by_key(
            Command._meta.db_table,
            "unnest(%s::bigint[]) AS wanted(id)",
            "(found.state || '') = %s AND found.attempts = %s",
        )
        return update + f"WHERE ctid = ANY({found})", [*params, State.DISPATCHING.value, attempt, ids]
    sql = update + f"WHERE id IN ({', '.join(['%s'] * len(ids))}) AND state = %s AND attempts = %s"
    return sql, [*params, *ids, State.DISPATCHING.value, attempt]


def finish_recovered(pk: int, attempt: int, event: str, now: datetime, changes: dict) -> int:
    """Give a command :func:`recover` took for lost at ``attempt`` the outcome its send had after
    all: only while it still waits as ``WorkerLost`` at that attempt (nothing has acted on the guess
    since), replacing the ``WorkerLost`` attempt row. Returns how many moved (0 or 1)."""
    moved = Command.objects.filter(
        pk=pk, attempts=attempt, state=State.FAILED, last_error_class=WORKER_LOST
    ).update(state=next_state(State.DISPATCHING, event), state_changed_at=now, **changes)
    if moved:
        Attempt.objects.filter(command_id=pk, number=attempt, error_class=WORKER_LOST).delete()
    return moved


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
            if together:
                # Only recover() competes for a dispatching row, and only after the visibility
                # timeout: the group moves whole, or the batch is redone row by row.
                ids = [one.command.pk for one in group]
                if finish_sends(ids, attempt, event, now, dict(changes)) != len(ids):
                    raise _Recovered
                recorded.extend(group)
                continue
            for one in group:
                if finish_sends([one.command.pk], attempt, event, now, dict(changes)):
                    recorded.append(one)
                elif finish_recovered(one.command.pk, attempt, event, now, dict(changes)):
                    # Recovered as lost while its outcome waited to be written (an outage outlasting
                    # the visibility timeout, a spool written back late): the outcome is what is
                    # known, so it replaces the guess.
                    log_event(logger, "recorded_after_recovery", command=one.command.pk, attempt=attempt)
                    recorded.append(one)
                else:
                    # Moved on since (resent, cancelled, or recovered and retried): the outcome is stale.
                    logger.warning(
                        "command %s was recovered while attempt %s was in flight", one.command.pk, attempt
                    )
                    results["stale"] += 1
        insert_attempts(recorded)
        results.update(State.SUCCEEDED.value if one.outcome.ok else State.FAILED.value for one in recorded)
        if items:
            with_commit(queue, lambda: queue.done(*items))
        transaction.on_commit(lambda: report_sends(recorded))
    return results


def report_sends(recorded: list[Sent]) -> None:
    """One log line per stored send (``dispatched`` or ``dispatch_failed`` with its outlook), and
    ``ankusa_dispatch_attempts_total`` / ``_latency_seconds`` — once the outcomes are committed."""
    for one in recorded:
        kind = one.command.connector.kind
        outcome, seconds = one.outcome, (one.finished - one.started).total_seconds()
        metrics.labelled(
            metrics.DISPATCH_ATTEMPTS, kind, "ok" if outcome.ok else "failed", outcome.outlook or ""
        ).inc()
        metrics.labelled(metrics.DISPATCH_LATENCY, kind).observe(seconds)
        fields = {"command": one.command.pk, "connector": one.command.connector_id, "attempt": one.attempt}
        if outcome.ok:
            log_event(logger, "dispatched", **fields, status=outcome.status, ms=round(seconds * 1000, 1))
        else:
            log_event(
                logger,
                "dispatch_failed",
                level=logging.WARNING,
                **fields,
                status=outcome.status,
                outlook=outcome.outlook or "unknown",
                error_class=outcome.error_class,
            )


def insert_attempts(sent: list[Sent]) -> None:
    """Write the attempt rows of finished sends, complete, in one INSERT.

    Not ``bulk_create``: it prepares every field of every row through the ORM, and the driver then
    quotes every value into the statement in Python, together about 0.15 ms of CPU a row
    (measured) on the path every command takes. Here the rows go as one JSON parameter, encoded
    in C, that the database unpacks itself (``jsonb_to_recordset`` on PostgreSQL, ``json_each``
    on SQLite). Every field of ``Attempt`` not set here gets its default, so a field added to the
    model with a default needs nothing here.
    """
    if not sent:
        return
    if stock("sql"):  # ANKUSA_STOCK_DJANGO: the ORM's bulk_create this stands for
        Attempt.objects.bulk_create(
            Attempt(
                command_id=one.command.pk,
                number=one.attempt,
                started_at=one.started,
                finished_at=one.finished,
                ok=one.outcome.ok,
                outlook=one.outcome.outlook or "",
                status_code=one.outcome.status,
                error_class=one.outcome.error_class,
                error_message=one.outcome.detail if not one.outcome.ok else "",
                response_excerpt=one.outcome.excerpt,
                manual=one.command.resend_by_id is not None,
                manual_by_id=one.command.resend_by_id,
            )
            for one in sent
        )
        return
    sql, others = _attempt_insert(connection.vendor)
    stamp = connection.ops.adapt_datetimefield_value
    defaults = {field.attname: field.get_db_prep_save(field.get_default(), connection) for field in others}
    rows = [
        {
            "command_id": one.command.pk,
            "number": one.attempt,
            "started_at": stamp(one.started),
            "finished_at": stamp(one.finished),
            "ok": one.outcome.ok,
            "outlook": one.outcome.outlook or "",
            "status_code": one.outcome.status,
            "error_class": one.outcome.error_class,
            "error_message": one.outcome.detail if not one.outcome.ok else "",
            "response_excerpt": one.outcome.excerpt,
            **defaults,
            "manual": one.command.resend_by_id is not None,
            "manual_by_id": one.command.resend_by_id,
        }
        for one in sent
    ]
    params = [json.dumps(rows, default=_json_value)]
    if connection.vendor == "postgresql":
        execute_prepared(connection, sql, params)
        return
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


# The fields insert_attempts sets itself; the others get their defaults.
ATTEMPT_FIELDS = frozenset(
    {
        "command_id",
        "number",
        "started_at",
        "finished_at",
        "ok",
        "outlook",
        "status_code",
        "error_class",
        "error_message",
        "response_excerpt",
        "manual",
        "manual_by_id",
    }
)


@functools.cache
def _attempt_insert(vendor: str) -> tuple[str, list]:
    """The statement of :func:`insert_attempts` for a database vendor, and the fields it leaves to
    their defaults."""
    quote = connection.ops.quote_name
    fields = [field for field in Attempt._meta.concrete_fields if not field.primary_key]
    if vendor == "postgresql":
        names = ", ".join(quote(field.attname) for field in fields)
        types = ", ".join(f"{quote(field.attname)} {field.db_type(connection)}" for field in fields)
        source = f"SELECT {names} FROM jsonb_to_recordset(%s::jsonb) AS r({types})"
    else:
        picks = ", ".join(f"json_extract(value, '$.{field.attname}')" for field in fields)
        source = f"SELECT {picks} FROM json_each(%s)"
    columns = ", ".join(quote(field.column) for field in fields)
    others = [field for field in fields if field.attname not in ATTEMPT_FIELDS]
    return f"INSERT INTO {Attempt._meta.db_table} ({columns}) {source}", others


def _json_value(value):
    """A value JSON has no type for, as the database reads it from text (a timestamp: ISO 8601)."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


@dataclass
class DrainSummary:
    claimed: int = 0
    results: Counter = field(default_factory=Counter)

    def line(self) -> str:
        results = ", ".join(f"{n} {result}" for result, n in sorted(self.results.items())) or "none"
        return f"claimed {self.claimed}: {results}"


@dataclass(frozen=True)
class _Entry:
    item: Item
    command: Command
    attempt: int


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


class _Recorder:
    """One thread that writes finished sends in batches (``record_outcomes``), while the
    dispatcher's own thread goes on claiming and starting: the two database paths overlap.

    An outcome is kept until it is written: a batch that fails (the database is down) is tried
    again after a pause doubling up to ``RETRY_MAX_S``, together with what arrived meanwhile. On
    ``close`` it is tried once more, and what still cannot be written goes to the spool
    (``commands.spool``), for the next dispatcher on this node to write back.
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


@dataclass(frozen=True)
class Unstarted:
    """What a sender hands the recorder for a send it never started: its start statement failed
    (``stamp``: the time that statement would have written), or it was never asked (None)."""

    stamp: datetime | None = None


def undo_starts(starts: list[tuple[int, int, datetime | None]]) -> int:
    """Move back to ``queued`` each command ``(id, attempt, stamp)`` still ``dispatching`` that
    attempt since ``stamp``: a start statement that failed may have committed unseen, and nothing
    was sent. Only that statement stamped that start (a start needs the command ``queued``), so
    no send is undone. Returns how many moved back."""
    moved = 0
    for pk, attempt, stamp in starts:
        if stamp is not None:
            moved += Command.objects.filter(
                pk=pk, attempts=attempt, state=State.DISPATCHING, state_changed_at=stamp
            ).update(state=State.QUEUED, attempts=F("attempts") - 1)
    return moved


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
    """Write back the outcomes spooled on this node (see ``commands.spool``); the counts of the
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


# What the loop writes on a command and a send never reads: left out of the rows loaded for
# sending, because each timestamp is parsed in Python (about 10 µs) on a path taken per command.
BOOKKEEPING_FIELDS = (
    "state_changed_at",
    "skip_decided_at",
    "approved_at",
    "created_at",
    "last_error",
    "last_error_class",
)


@functools.cache
def _sending_fields() -> tuple[list[str], list[tuple], str]:
    """What :func:`load_for_sending` reads: the fields' names, ``(position, field, converter)`` for
    each converter a field has, and its PostgreSQL statement."""
    fields = [f for f in Command._meta.concrete_fields if f.name not in BOOKKEEPING_FIELDS]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    # The fields' own converters, as the ORM applies them to loaded rows (the JSON payload's decoding).
    decode = [(i, f, convert) for i, f in enumerate(fields) for convert in f.get_db_converters(connection)]
    sql = f"SELECT {columns} FROM {Command._meta.db_table} WHERE id = ANY(%s::bigint[])"
    return [f.attname for f in fields], decode, sql


def load_for_sending(ids: list[int]) -> dict[int, Command]:
    """The commands ``ids`` by id, without ``BOOKKEEPING_FIELDS`` (deferred), in one query.

    On PostgreSQL a prepared statement whose rows become instances directly (``Model.from_db``, the
    ORM's own constructor for loaded rows): the queryset's compilation and its per-row iterator
    cost more CPU than the query, once per claimed batch. Elsewhere the queryset.
    """
    if connection.vendor != "postgresql" or stock("sql"):  # stock: ANKUSA_STOCK_DJANGO
        return Command.objects.defer(*BOOKKEEPING_FIELDS).in_bulk(ids)
    names, decode, sql = _sending_fields()
    commands = {}
    for row in execute_prepared(connection, sql, [ids])[0]:
        values = list(row)
        for i, f, convert in decode:
            values[i] = convert(values[i], f, connection)
        command = Command.from_db(connection.alias, names, values)
        commands[command.pk] = command
    return commands


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
        commands = load_for_sending([item.payload["command"] for item in wanted])
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
        # Connectors are read once per drain and shared by their commands: a drain lasts a round
        # (or a Celery task), so a saved connector is seen from the next one on.
        self._connectors.clear()
        summary = DrainSummary()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        exhausted = False
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
            if back:
                self.queue.unclaim(*(entry.item for entry in back))
            # Hold up to four pools' worth (sends in flight and claimed sends waiting for a thread)
            # and claim two at a time once there is room for them, while a pool still waits: a
            # sender never waits for a claim, and each claim (two round trips, and the loading of
            # its commands) is shared by many sends. An item waits a few sends at most, far inside
            # the visibility timeout.
            room = HELD_POOLS * self.concurrency - held
            if max_items is not None:
                room = min(room, max_items - summary.claimed)
            claim_at = CLAIM_POOLS * self.concurrency
            if not stopping and not exhausted and room > 0 and (room >= claim_at or not waiting):
                want = min(self.batch, room)
                # Read before the claim: once it is set, everything fed is committed and claimable.
                fed = fed_until is None or fed_until.is_set()
                items = self.queue.claim(want)
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
                if (stopping or exhausted) and not senders.waiting and not senders.in_flight.total():
                    break
                senders.room.wait(POLL_S)
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


# --- recover -------------------------------------------------------------------------------------


@dataclass
class RecoverSummary:
    worker_lost: int = 0
    items_requeued: int = 0
    lost_requeued: int = 0
    complete: bool = field(default=True, compare=False)  # False: stopped at its bound, more to do


# Commands (or queue items) recovery settles per transaction: a backlog of thousands costs a few
# dozen statements, and a bounded recovery looks at its bound between two of them.
RECOVER_BATCH = 500


def recover(
    now: datetime | None = None,
    *,
    queue: ReliableFIFO | None = None,
    pending: set[int] = frozenset(),
    until: Callable[[], bool] = lambda: False,
    batch: int | None = None,
) -> RecoverSummary:
    """Settle what dead workers left behind (see the module docstring), ``batch`` rows a
    transaction.

    ``pending``: commands whose outcome the caller holds, not written yet (the database was down):
    their worker is alive, so they are not lost, whatever their age. ``until``: asked before each
    batch; once it says True the recovery stops there (``complete`` False) and leaves the rest to
    the next one — how ``--max-seconds`` and a stopping loop bound it. Every batch is whole.
    """
    now = now or timezone.now()
    queue = queue or commands_queue()
    batch = batch or RECOVER_BATCH
    visibility = timedelta(seconds=settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S)
    summary = RecoverSummary()

    def bounded() -> bool:
        if until():
            summary.complete = False
        return not summary.complete

    abandoned = Command.objects.filter(state=State.DISPATCHING, state_changed_at__lt=now - visibility)
    if pending:
        abandoned = abandoned.exclude(pk__in=pending)
    after = 0
    while not bounded():
        with transaction.atomic():
            # Locked, so each row's decision holds until the batch commits; a row another recovery
            # holds is its to settle.
            rows = list(
                abandoned.filter(pk__gt=after)
                .order_by("pk")
                .select_for_update(skip_locked=True, of=("self",))
                .values(*DECISION_FIELDS, "state_changed_at")[:batch]
            )
            if not rows:
                break
            after = rows[-1]["id"]
            skips: dict[str, list[int]] = defaultdict(list)
            for row in rows:
                decision = decide_for(
                    {**row, "state": State.FAILED, "last_outlook": None, "resend_by": None}, now
                )
                skips[decision.skip or ""].append(row["id"])
            for skip, ids in skips.items():
                moved = Command.objects.filter(pk__in=ids).transition(
                    State.DISPATCHING,
                    Event.FAIL,
                    now,
                    last_outlook="",
                    last_error_class=WORKER_LOST,
                    last_error=WORKER_LOST_DETAIL,
                    resend_by=None,  # a resend is spent by its send, even one whose worker died
                    skip_reason=skip,
                    skip_decided_at=now,
                )
                if moved != len(ids):  # the rows are locked: anything else is a bug, so undo the batch
                    raise RuntimeError(f"recovery moved {moved} of {len(ids)} locked commands")
            Attempt.objects.bulk_create(
                Attempt(
                    command_id=row["id"],
                    number=row["attempts"],
                    started_at=row["state_changed_at"],
                    finished_at=now,
                    error_class=WORKER_LOST,
                    error_message=WORKER_LOST_DETAIL,
                    manual=row["resend_by"] is not None,
                    manual_by_id=row["resend_by"],
                )
                for row in rows
            )
            summary.worker_lost += len(rows)
        if len(rows) < batch:
            break

    while not bounded():
        expired = queue.handle_expired(visibility, action="requeue", limit=batch)
        summary.items_requeued += len(expired)
        if len(expired) < batch:
            break

    # A queued command whose item would have been claimed by now, had it one: claims are strictly
    # FIFO, so its item would be older than the oldest one still waiting. The visibility timeout
    # is the slack between a state change and its enqueue (a commit apart, normally milliseconds).
    cutoff = now - visibility - (queue.age("main") or timedelta(0))
    lost = Command.objects.filter(state=State.QUEUED, state_changed_at__lt=cutoff)
    after = 0
    while not bounded():
        with transaction.atomic():
            rows = list(
                lost.filter(pk__gt=after)
                .order_by("pk")
                .select_for_update(skip_locked=True, of=("self",))
                .values("id", "attempts")[:batch]
            )
            if not rows:
                break
            after = rows[-1]["id"]
            # Touching state_changed_at keeps the next round from enqueuing them again.
            Command.objects.filter(pk__in=[row["id"] for row in rows]).update(state_changed_at=now)
            enqueue_with_commit(queue, [item_payload(row["id"], row["attempts"] + 1) for row in rows])
            summary.lost_requeued += len(rows)
        if len(rows) < batch:
            break
    return summary


# --- one round -----------------------------------------------------------------------------------


def recovery_line(r: RecoverSummary) -> str:
    line = f"recovered {r.worker_lost} lost sends, {r.items_requeued} expired items, {r.lost_requeued} lost items"
    return line if r.complete else f"{line} (stopped at its bound, the rest next time)"


def keep_recovering(
    dispatcher: Dispatcher,
    stop: threading.Event,
    *,
    every: float,
    report: Callable[[RecoverSummary], None] = lambda summary: None,
    wait: Callable[[float], bool] | None = None,
) -> None:
    """Run :func:`recover` every ``every`` seconds until ``stop``, for a long-running loop: a
    killed dispatcher's work is back within the visibility timeout plus ``every``, whatever the
    round interval. The outcomes ``dispatcher`` holds unwritten are not taken for lost. A failed
    recovery (the database is down) is tried again after a pause doubling up to ``RETRY_MAX_S``.
    ``report`` gets each summary that recovered something; ``wait`` (default ``stop.wait``) is
    the clock tests inject."""
    wait = wait or stop.wait
    failures = 0
    while not stop.is_set():
        try:
            replay_spool(dispatcher.queue)  # a spooled outcome is written back, not taken for lost
            summary = recover(
                queue=dispatcher.queue, pending=dispatcher.pending_commands(), until=stop.is_set
            )
        except Exception as exc:
            failures += 1
            if failures == 1:
                logger.exception("dispatch recovery failed; trying again")
            else:
                logger.warning("dispatch recovery failed again (%s)", exc)
            connections.close_all()
        else:
            failures = 0
            if summary.worker_lost or summary.items_requeued or summary.lost_requeued:
                report(summary)
        if wait(retry_delay(failures, every) if failures else every):
            break
    connections.close_all()


@dataclass
class RoundSummary:
    recovered: RecoverSummary | None  # None: recovery runs on its own timer (keep_recovering)
    swept: SweepSummary
    drained: DrainSummary
    seconds: float

    def line(self) -> str:
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.swept.skipped.items())) or "none"
        recovered = "" if self.recovered is None else f"{recovery_line(self.recovered)}; "
        return (
            f"dispatch round: took {self.swept.taken}, skipped {skipped}; "
            f"{self.drained.line()}; {recovered}{self.seconds:.2f} s"
        )


def run_round(
    dispatcher: Dispatcher,
    *,
    max_seconds: float | None = None,
    recovering: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> RoundSummary:
    """Recover (unless ``recovering`` is False: a timer does it), then sweep and drain at once:
    recovery first, so a restart resumes in one round; the sweep in a thread of its own, so the
    drain sends what each sweep batch has queued (and committed) while the sweep decides on the
    next, instead of waiting for the whole sweep. ``clock`` times the round (tests move it)."""
    started = clock()
    heartbeat.beat("loop")  # the dashboard's "is the loop alive"
    replay_spool(dispatcher.queue)  # before recovery, which would take the spooled sends for lost
    recovered = None
    if recovering:
        # Bounded by the round's own bound (and a stop), a batch at a time.
        deadline = None if max_seconds is None else started + max_seconds

        def until() -> bool:
            return dispatcher.stop.is_set() or (deadline is not None and clock() >= deadline)

        recovered = recover(queue=dispatcher.queue, pending=dispatcher.pending_commands(), until=until)
    swept: list[SweepSummary] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def sweeping() -> None:
        try:
            swept.append(sweep(queue=dispatcher.queue))
        except BaseException as exc:  # raised again in this thread, after the drain
            failed.append(exc)
        finally:
            connections.close_all()
            done.set()

    sweeper = threading.Thread(target=sweeping, name="sweep", daemon=True)
    sweeper.start()
    try:
        drained = dispatcher.drain(max_seconds=max_seconds, fed_until=done)
    finally:
        sweeper.join()
    if failed:
        raise failed[0]
    seconds = clock() - started
    metrics.DISPATCH_ROUND.observe(seconds)
    return RoundSummary(recovered, swept[0], drained, seconds)
