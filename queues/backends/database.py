"""The database backend of the reliable FIFO: one ``QueueItem`` row per item (the default).

Claims: on PostgreSQL one statement (``FOR UPDATE SKIP LOCKED`` on the partial index
``queueitem_main_order``), so any number of consumers claim at once without waiting on each other,
no row goes to two of them, and the cost depends on ``n``, not on how many items wait; on SQLite
the same claim in a short ``BEGIN IMMEDIATE`` transaction (writers take turns, which is all SQLite
offers). ``enqueue`` joins the caller's transaction on the caller's connection and never commits
on its own inside one: intake writes its commands and their queue items together, and a rollback
leaves no item behind. ``done``, recovery, requeue and failure act only on items still busy under
the caller's claim, each in one statement or under a row lock, so a concurrent recovery cannot slip
in between. A PostgreSQL claim that commits by itself does not wait for the disk: a server crash
may forget it (the item is claimable again), never lose the item.

On PostgreSQL a row entering main notifies its queue's waiters on commit while one sleeps (a
trigger, see ``queues.wake``), and ``wait_for_work`` says it sleeps, looks, and waits on the
process's one listening connection; on SQLite it sleeps (consumers poll).

What it does NOT do: ``length`` counts rows (through the partial indexes) rather than reading a
counter, O(n) instead of the seed's O(1) — it serves stats pages, not the hot path; and a waiting
``claim`` polls (every 10 ms rising to 200 ms) instead of being woken.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from itertools import chain
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import F, Max, Min

from ankusa_site.core.prepared import execute_prepared
from ankusa_site.core.stock import stock
from queues import wake
from queues.backends import database_stock
from queues.fifo import (
    Action,
    Item,
    Kind,
    ReliableFIFO,
    clip_error,
    encode_payload,
)
from queues.models import QueueItem

State = QueueItem.State
PAYLOAD = QueueItem._meta.get_field("payload")
# Rows handled per transaction by recovery and the failed-list operations, so a long run holds no
# lock for long and never loads a whole sub-queue into memory; also the rows per INSERT or DELETE
# statement of enqueue and done (4 and 3 parameters a row stay far below SQLite's 32,766).
BATCH = 1000
TABLE = QueueItem._meta.db_table

# The hot statements (enqueue, the PostgreSQL claim, done) are written in SQL, on PostgreSQL with the
# same text for any number of items so they stay prepared on the server (ankusa_site.core.prepared), and
# the claim builds Item values straight from its rows: the ORM's per-row model instances and
# per-field preparation cost more CPU than the statements themselves, and the dispatch loop runs
# them once per command.

# The UPDATE finds the picked rows by ctid (a Tid Scan, no index lookup): safe because the CTE
# holds their row locks, so no other transaction can move them before the UPDATE runs.
_CLAIM_SQL_POSTGRESQL = """
WITH {before}picked AS (
    SELECT ctid FROM queues_queueitem
    WHERE queue = %s AND state = 'main'
    ORDER BY position, id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE queues_queueitem AS item
SET state = 'busy', claimed_at = %s, claims = item.claims + 1
FROM picked{also}
WHERE item.ctid = picked.ctid
RETURNING item.id, item.position, item.payload, item.enqueued_at, item.requeue_count,
    item.fail_count, item.last_error, item.claims
"""
CLAIM_SQL_POSTGRESQL = _CLAIM_SQL_POSTGRESQL.format(before="", also="")
# The same claim committing by itself (outside a caller's transaction), without waiting for its
# write-ahead log to reach the disk: a server crash may forget it, and the item is then claimable
# in main again, never lost (as on the Redis queue, whose claims are never on disk). A claim is
# bookkeeping; what the consumer does next that must last (the dispatcher's start, before any
# send) commits synchronously after it, and that flush carries the claim's record too. What it
# takes off the way from a wake to the receiver: bench/README.md, *Accepted → sent*.
CLAIM_SQL_POSTGRESQL_ASYNC_COMMIT = _CLAIM_SQL_POSTGRESQL.format(
    before="asynchronous AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true)), ",
    also=", asynchronous",
)

# A busy row finished by ``done``: one of the given ids, still busy, still under the given claim.
# One statement per call (per BATCH items), by primary key, with the claims as a row-value test
# rather than one OR'd condition per item, so a concurrent recovery cannot slip in between the
# check and the delete.
DONE_SQL = f"""
DELETE FROM {TABLE}
WHERE id IN ({{ids}}) AND queue = %s AND state = 'busy' AND (id, claims) IN (VALUES {{tokens}})
RETURNING id
"""
# The same for bare ids, which carry no claim to check.
DONE_ANY_CLAIM_SQL = (
    f"DELETE FROM {TABLE} WHERE id IN ({{ids}}) AND queue = %s AND state = 'busy' RETURNING id"
)
# PostgreSQL: the same two, with the ids (and claims) as arrays, so the text is the same for any
# count and the server keeps it prepared. Each item is one primary-key lookup whatever the
# statistics say: a subquery per id, whose tests match no partial index (``|| ''``, leaving the
# primary key as the only index), then the row deleted by its version (a TID scan; one named twice
# is deleted once; one changed meanwhile by another transaction has a new version and is skipped,
# as a failed test would skip it). With statistics gathered on an empty table a join walks the
# whole table, or the busy items' partial index estimated at one row, for every statement.
_HELD = (
    f"SELECT found.ctid FROM {TABLE} AS found WHERE found.id = held.id AND (found.queue || '') = %s"
    " AND (found.state || '') = 'busy'"
)
DONE_SQL_POSTGRESQL = f"""
DELETE FROM {TABLE} AS item
WHERE item.ctid = ANY(ARRAY(
    SELECT ({_HELD} AND found.claims = held.claims) FROM unnest(%s::bigint[], %s::integer[]) AS held(id, claims)
))
RETURNING item.id
"""
DONE_ANY_CLAIM_SQL_POSTGRESQL = f"""
DELETE FROM {TABLE} AS item
WHERE item.ctid = ANY(ARRAY(SELECT ({_HELD}) FROM unnest(%s::bigint[]) AS held(id)))
RETURNING item.id
"""
ENQUEUE_COLUMNS = (
    "(queue, state, position, payload, enqueued_at, claims, requeue_count, fail_count, last_error)"
)
# PostgreSQL takes the payloads as one JSON array, split by the server: one parameter whatever the
# count, where a VALUES row each would cost the driver four parameters to quote in Python.
# Positions at the tail come from a sequence (``TAIL_SEQUENCE``, made by migration 0002): every
# placement at the tail of any queue takes the next values, so a new item always sorts after the
# items already placed there, in O(1) and without reading the index for the current tail (an
# InitPlan that cost about 0.06 ms of the server's CPU per intake write). Gaps do not matter: only
# the order does. SQLite has no sequences: there an enqueue reads the tail (``TAIL_SQL``) inside its
# write transaction, which SQLite runs one at a time.
TAIL_SEQUENCE = "queues_queueitem_tail"
TAIL_SQL = f"SELECT MAX(position) FROM {TABLE} WHERE queue = %s AND state = 'main'"


def _append_sql(rows: str, payload: str, order: str) -> str:
    """PostgreSQL: an INSERT of items at the tail of main, one per row of ``rows`` in the order of
    ``order``; ``payload`` is the JSON of each, an SQL expression over ``rows``. Parameters: the
    queue's name and the enqueue time, then those of ``rows``. (The rows are sorted in a subquery,
    so the sequence gives them their positions in that order.)"""
    return (
        f"INSERT INTO {TABLE} {ENQUEUE_COLUMNS} "
        f"SELECT %s, 'main', nextval('{TAIL_SEQUENCE}'), r.payload, %s, 0, 0, 0, '' "
        f"FROM (SELECT {payload} AS payload FROM {rows} ORDER BY {order}) AS r"
    )


ENQUEUE_SQL_POSTGRESQL = (
    _append_sql(
        "jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS p(payload, number)", "p.payload", "p.number"
    )
    + " RETURNING id, position"
)
ENQUEUE_SQL = f"INSERT INTO {TABLE} {ENQUEUE_COLUMNS} VALUES {{rows}} RETURNING id, position"
ENQUEUE_ROW = "(%s, 'main', %s, %s, %s, 0, 0, 0, '')"

ORDER = {"main": ("position", "id"), "busy": ("claimed_at", "id"), "failed": ("failed_at", "id")}


# A consumer's statements find rows by key in a table whose size swings: nearly empty while the
# consumers keep up, a backlog of many thousands when they do not. PostgreSQL keeps a prepared
# statement's plan made while the table was a page (a scan of the whole table, cheaper then) and
# uses it for every row until autovacuum's next ANALYZE: a sudden backlog drained 26 times more
# slowly than by a new session (bench/queues.py). So a claim that comes back full says a backlog
# is there, and each consumer connection drops its plans (DISCARD PLANS: its statements stay
# prepared) before its next statement, at most once per REPLAN_EVERY_S. Planning every statement
# afresh instead (plan_cache_mode) cost the dispatcher's idle path about 0.5 ms (bench/latency.py).
REPLAN_EVERY_S = 10.0


class _Replans:
    """The process's count of backlogs seen, which each consumer connection's plans must postdate."""

    clock = staticmethod(time.monotonic)  # tests move it

    def __init__(self):
        self.epoch = 0
        self.at = float("-inf")

    def saw_backlog(self) -> None:
        now = self.clock()
        if now - self.at >= REPLAN_EVERY_S:
            self.epoch, self.at = self.epoch + 1, now

    def fresh(self, connection) -> None:
        """Before a consumer statement on ``connection`` (PostgreSQL): drop its plans if they may
        predate the last backlog seen."""
        if not self.epoch:
            return
        mark = (self, connection.connection, self.epoch)
        if connection.__dict__.get("_ankusa_plans") == mark:
            return
        with connection.cursor() as cursor:
            cursor.execute("DISCARD PLANS")
        connection._ankusa_plans = mark


REPLANS = _Replans()


class DatabaseFIFO(ReliableFIFO):
    backend = "database"

    def __init__(self, name: str, *, using: str = "default", **options: Any):
        super().__init__(name, **options)
        self.using = using

    # --- querysets ----------------------------------------------------------------------------------

    def _rows(self, kind: Kind | None = None):
        rows = QueueItem.objects.using(self.using).filter(queue=self.name)
        return rows if kind is None else rows.filter(state=kind)

    def _atomic(self):
        """Join the caller's transaction if there is one; never a savepoint of our own."""
        return transaction.atomic(using=self.using, savepoint=False)

    def _held(self, tokens: list[tuple[int, int | None]]) -> list[QueueItem]:
        """The busy rows still under the given claims, in the given order, locked until the
        transaction ends (so the claim check below cannot race a recovery)."""
        wanted = dict(tokens)
        rows = self._rows(State.BUSY).filter(pk__in=wanted).order_by("pk").select_for_update()
        held = {row.pk: row for row in rows if wanted[row.pk] in (None, row.claims)}
        return [held[pk] for pk in wanted if pk in held]

    def _tail(self, count: int) -> list[int]:
        """``count`` positions after the last item of main, in order (from the sequence on
        PostgreSQL, as every tail placement there)."""
        if not count:  # nothing to place (a batch that found no rows): no query
            return []
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT nextval('{TAIL_SEQUENCE}') FROM generate_series(1, %s)", [count])
                return sorted(position for (position,) in cursor.fetchall())
        last = self._rows(State.MAIN).aggregate(last=Max("position"))["last"]
        start = 1 if last is None else last + 1
        return list(range(start, start + count))

    def _head(self, count: int) -> list[int]:
        """``count`` positions before the first item of main, in order."""
        if not count:
            return []
        first = self._rows(State.MAIN).aggregate(first=Min("position"))["first"]
        first = 1 if first is None else first
        return list(range(first - count, first))

    # --- producers ----------------------------------------------------------------------------------

    def enqueue(self, *payloads: Any) -> list[int]:
        encoded = [encode_payload(payload) for payload in payloads]
        if not encoded:
            return []
        if stock("sql"):  # ANKUSA_STOCK_DJANGO: the ORM's writes, the reference
            return database_stock.enqueue(self, payloads, self.clock())
        connection = connections[self.using]
        stamp = connection.ops.adapt_datetimefield_value(self.clock())
        if connection.vendor == "postgresql":
            # One statement: inside the caller's transaction it is part of it, outside it commits
            # by itself — no BEGIN and COMMIT of its own.
            rows, _ = execute_prepared(
                connection, ENQUEUE_SQL_POSTGRESQL, [self.name, stamp, f"[{','.join(encoded)}]"]
            )
        else:
            with self._atomic(), connection.cursor() as cursor:
                cursor.execute(TAIL_SQL, [self.name])
                last = cursor.fetchone()[0]
                start = 1 if last is None else last + 1
                rows = []
                for offset in range(0, len(encoded), BATCH):
                    chunk = encoded[offset : offset + BATCH]
                    params = chain.from_iterable(
                        (self.name, position, text, stamp)
                        for position, text in enumerate(chunk, start + offset)
                    )
                    cursor.execute(
                        ENQUEUE_SQL.format(rows=", ".join([ENQUEUE_ROW] * len(chunk))), list(params)
                    )
                    rows += cursor.fetchall()
        # RETURNING promises no order; the positions give it back.
        return [pk for pk, _ in sorted(rows, key=lambda row: row[1])]

    def joins_transaction(self, using: str = DEFAULT_DB_ALIAS) -> bool:
        return using == self.using  # its rows are written on the caller's connection, or not

    def enqueue_in_statement(
        self, rows: str, payload: str, order: str, *, using: str = DEFAULT_DB_ALIAS
    ) -> tuple[str, list] | None:
        """PostgreSQL on the caller's connection: the same ``INSERT`` as ``enqueue``'s, from the
        caller's rows (intake: a delivery, its commands and their items in one statement, which
        commits by itself). None on SQLite and under ``ANKUSA_STOCK_DJANGO``'s ``sql`` layer."""
        connection = connections[self.using]
        if using != self.using or connection.vendor != "postgresql" or stock("sql"):
            return None
        stamp = connection.ops.adapt_datetimefield_value(self.clock())
        return _append_sql(rows, payload, order), [self.name, stamp]

    # --- waking consumers ---------------------------------------------------------------------------

    def wake(self) -> None:
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            # In the caller's transaction, if any: delivered on its commit, dropped by a rollback.
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [wake.CHANNEL, self.name])

    def wait_for_work(self, timeout: float) -> bool:
        connection = connections[self.using]
        if connection.vendor != "postgresql":
            return super().wait_for_work(timeout)
        if timeout <= 0:
            # A look, not a sleep: it does not hold the gate, so the commits of a busy consumer's
            # producers do not notify (and take turns) for it; it finds their work by claiming.
            looking = wake.listening(self.using)  # None: no listener (and connection) started for it
            return looking is not None and looking.wait(self.name, 0)
        listener = wake.listener(self.using)
        gate = listener.gate
        # About to sleep: say so, then look (commits notify only while a consumer sleeps).
        if listener.connected.is_set() and not gate.asleep() and gate.sleep(self.name):
            return True
        woken = listener.wait(self.name, timeout)
        if woken:
            gate.rise()
        return woken

    # --- consumers ----------------------------------------------------------------------------------

    def _claim(self, n: int, now: datetime) -> list[Item]:
        connection = connections[self.using]
        if (listener := wake.listening(self.using)) is not None:
            listener.gate.rise()  # a consumer that claims is awake: commits need not notify it
        if connection.vendor == "postgresql":
            REPLANS.fresh(connection)
        if stock("sql"):
            items = database_stock.claim(self, n, now)
            if connection.vendor == "postgresql" and n > 1 and len(items) == n:
                REPLANS.saw_backlog()
            return items
        if connection.vendor == "postgresql":
            # In a caller's transaction the setting would cover all of its writes: not there.
            claim = CLAIM_SQL_POSTGRESQL if connection.in_atomic_block else CLAIM_SQL_POSTGRESQL_ASYNC_COMMIT
            rows, _ = execute_prepared(connection, claim, [self.name, n, now])
            if n > 1 and len(rows) == n:
                REPLANS.saw_backlog()
            rows.sort(key=lambda row: (row[1], row[0]))
            decode = PAYLOAD.from_db_value
            return [
                Item(
                    id=pk,
                    payload=decode(payload, None, connection),
                    enqueued_at=enqueued_at,
                    claimed_at=now,
                    requeue_count=requeue_count,
                    fail_count=fail_count,
                    last_error=last_error,
                    claims=claims,
                )
                for pk, _, payload, enqueued_at, requeue_count, fail_count, last_error, claims in rows
            ]
        # SQLite: three small statements in the BEGIN IMMEDIATE transaction the settings make of every
        # atomic (20 s busy timeout): writers take turns.
        main = self._rows(State.MAIN)
        if not main.exists():
            return []  # an idle consumer's poll takes no write lock
        with transaction.atomic(using=self.using):
            ids = list(main.order_by("position", "id").values_list("id", flat=True)[:n])
            self._rows().filter(pk__in=ids).update(state=State.BUSY, claimed_at=now, claims=F("claims") + 1)
            rows = list(self._rows().filter(pk__in=ids).order_by("position", "id"))
        return [database_stock.item_of(row) for row in rows]

    def done_in_statement(
        self, *items: Item, using: str = DEFAULT_DB_ALIAS
    ) -> tuple[str, list, Callable[[list[int]], int]] | None:
        """PostgreSQL on the caller's connection: ``done``'s ``DELETE`` of claimed items (the
        recorder: a batch's outcomes and its items' end in one statement). None where
        ``enqueue_in_statement`` gives None, and for a bare id (no claim to check)."""
        connection = connections[self.using]
        if using != self.using or connection.vendor != "postgresql" or stock("sql"):
            return None
        if not all(isinstance(item, Item) for item in items):
            return None
        REPLANS.fresh(connection)
        wanted = [item.id for item in items]

        def finished(held: list[int]) -> int:
            self._report_skipped("done", wanted, held)
            return len(held)

        return DONE_SQL_POSTGRESQL, [self.name, wanted, [item.claims for item in items]], finished

    def done(self, *items: Item | int) -> int:
        tokens = _tokens(items)
        claimed = [token for token in tokens if token[1] is not None]
        bare = [pk for pk, claims in tokens if claims is None]
        held: list[int] = []
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            REPLANS.fresh(connection)
        if stock("sql"):
            held = database_stock.done(self, claimed, bare)
        elif connection.vendor == "postgresql":
            # Each statement stands alone (finishing an item twice is a no-op): no transaction of
            # its own, and inside the caller's it is part of it. The ids go as arrays, so one
            # statement takes any number of them.
            if claimed:
                params = [self.name, [pk for pk, _ in claimed], [claims for _, claims in claimed]]
                held.extend(pk for (pk,) in execute_prepared(connection, DONE_SQL_POSTGRESQL, params)[0])
            if bare:
                params = [self.name, bare]
                held.extend(
                    pk for (pk,) in execute_prepared(connection, DONE_ANY_CLAIM_SQL_POSTGRESQL, params)[0]
                )
        else:
            with self._atomic(), connection.cursor() as cursor:
                for offset in range(0, len(claimed), BATCH):
                    chunk = claimed[offset : offset + BATCH]
                    sql = DONE_SQL.format(ids=_marks(len(chunk)), tokens=_marks(len(chunk), "(%s, %s)"))
                    params = [pk for pk, _ in chunk] + [self.name] + list(chain.from_iterable(chunk))
                    cursor.execute(sql, params)
                    held.extend(pk for (pk,) in cursor.fetchall())
                for offset in range(0, len(bare), BATCH):
                    chunk = bare[offset : offset + BATCH]
                    cursor.execute(DONE_ANY_CLAIM_SQL.format(ids=_marks(len(chunk))), [*chunk, self.name])
                    held.extend(pk for (pk,) in cursor.fetchall())
        self._report_skipped("done", [pk for pk, _ in tokens], held)
        return len(held)

    def _release(self, mode: str, items, *, error: str = "", front: bool = False) -> int:
        tokens = _tokens(items)
        with self._atomic():
            rows = self._held(tokens)
            self._move(rows, mode, error=error, front=front, now=self.clock())
        self._report_skipped(mode, [pk for pk, _ in tokens], [row.pk for row in rows])
        return len(rows)

    def _move(self, rows: list[QueueItem], mode: str, *, error: str, front: bool, now: datetime) -> None:
        """Move locked busy rows: back to main (``requeue`` within the limit, ``unclaim``), to
        failed (``fail``, or ``requeue`` past the limit) or out (``drop``)."""
        if mode == "drop":
            self._rows().filter(pk__in=[row.pk for row in rows]).delete()
            return
        error = clip_error(error)
        back = []
        for row in rows:
            row.claimed_at = None
            if mode == "unclaim" or (mode == "requeue" and row.requeue_count < self.requeue_limit):
                row.requeue_count += mode == "requeue"
                row.last_error = error or row.last_error
                back.append(row)
            else:
                row.state = State.FAILED
                row.fail_count += 1
                row.failed_at = now
                row.last_error = error or row.last_error or f"requeue limit of {self.requeue_limit} reached"
        positions = self._head(len(back)) if front else self._tail(len(back))
        for row, position in zip(back, positions, strict=True):
            row.state = State.MAIN
            row.position = position
        fields = ["state", "position", "claimed_at", "failed_at", "requeue_count", "fail_count", "last_error"]
        QueueItem.objects.using(self.using).bulk_update(rows, fields)

    # --- recovery and the failed list ---------------------------------------------------------------

    def _handle_expired(
        self, older_than: timedelta | None, action: Action, *, limit: int | None
    ) -> list[Item]:
        now = self.clock()
        cutoff = now - (self.visibility_timeout if older_than is None else older_than)
        error = f"claim expired (held longer than {(now - cutoff).total_seconds():g} s)"
        touched: list[Item] = []
        while limit is None or len(touched) < limit:
            size = BATCH if limit is None else min(BATCH, limit - len(touched))
            with self._atomic():
                expired = self._rows(State.BUSY).filter(claimed_at__lt=cutoff).order_by("claimed_at", "id")
                rows = list(expired.select_for_update(skip_locked=True)[:size])
                touched.extend(database_stock.item_of(row) for row in rows)
                self._move(rows, action, error=error, front=False, now=now)
            if len(rows) < size:
                break
        return touched

    def requeue_failed(
        self, max_fail_count: int | None = None, delay: timedelta | None = None, *, limit: int | None = None
    ) -> int:
        now = self.clock()
        candidates = self._rows(State.FAILED).order_by("failed_at", "id")
        if delay is not None:
            candidates = candidates.filter(failed_at__lte=now - delay)
        if max_fail_count is not None:
            candidates = candidates.filter(fail_count__lte=max_fail_count)
        moved = 0
        while limit is None or moved < limit:
            size = BATCH if limit is None else min(BATCH, limit - moved)
            with self._atomic():
                rows = list(candidates.select_for_update(skip_locked=True)[:size])
                for row, position in zip(rows, self._tail(len(rows)), strict=True):
                    row.state, row.position = State.MAIN, position
                    row.failed_at, row.requeue_count = None, 0
                QueueItem.objects.using(self.using).bulk_update(
                    rows, ["state", "position", "failed_at", "requeue_count"]
                )
            moved += len(rows)
            if len(rows) < size:
                break
        return moved

    def remove_failed(self, older_than: timedelta | None = None, *, limit: int | None = None) -> int:
        candidates = self._rows(State.FAILED).order_by("failed_at", "id")
        if older_than is not None:
            candidates = candidates.filter(failed_at__lte=self.clock() - older_than)
        removed = 0
        while limit is None or removed < limit:
            size = BATCH if limit is None else min(BATCH, limit - removed)
            ids = list(candidates.values_list("id", flat=True)[:size])
            count = self._rows(State.FAILED).filter(pk__in=ids).delete()[0] if ids else 0
            removed += count
            if len(ids) < size:
                break
        return removed

    # --- operator actions on chosen rows (the admin's requeue / drop) -------------------------------

    def requeue_ids(self, ids: Iterable[int]) -> int:
        """See ``ReliableFIFO.requeue_ids``: in their last order in main (position, then id)."""
        ids = [int(pk) for pk in ids]
        with self._atomic():
            rows = list(
                self._rows()
                .filter(pk__in=ids, state__in=[State.BUSY, State.FAILED])
                .order_by("position", "id")
                .select_for_update()
            )
            for row, position in zip(rows, self._tail(len(rows)), strict=True):
                row.state, row.position = State.MAIN, position
                row.claimed_at, row.failed_at, row.requeue_count = None, None, 0
            QueueItem.objects.using(self.using).bulk_update(
                rows, ["state", "position", "claimed_at", "failed_at", "requeue_count"]
            )
        return len(rows)

    def drop_ids(self, ids: Iterable[int]) -> int:
        """See ``ReliableFIFO.drop_ids``."""
        ids = [int(pk) for pk in ids]
        return self._rows().filter(pk__in=ids).delete()[0]

    # --- inspection ---------------------------------------------------------------------------------

    def length(self, kind: Kind = "main") -> int:
        return self._rows(kind).count()

    def peek(self, kind: Kind = "main", n: int = 1) -> list[Item]:
        return [database_stock.item_of(row) for row in self._rows(kind).order_by(*ORDER[kind])[:n]]

    def flush(self) -> int:
        return self._rows().delete()[0]


def _tokens(items) -> list[tuple[int, int | None]]:
    """``(id, claims)`` for each item; ``claims`` is None for a bare id (no claim check)."""
    return [(item.id, item.claims) if isinstance(item, Item) else (int(item), None) for item in items]


def _marks(count: int, mark: str = "%s") -> str:
    """``count`` placeholders for an ``IN (…)`` or ``VALUES …`` list."""
    return ", ".join([mark] * count)
