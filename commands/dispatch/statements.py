"""The loop's hot SQL, written out per database vendor: the ``queued → dispatching`` starts
(:func:`start_sends`), the finishes (:func:`finish_sends`, and with their attempt rows
:func:`finish_with_attempts`; on PostgreSQL a recorded batch whole, :func:`finish_in_one`), undoing a
start that sent nothing (:func:`undo_starts`), the attempt rows (:func:`insert_attempts`), the
commands loaded for sending (:func:`load_for_sending`) and the outage hold's look at a batch's
connectors (:func:`failing_or_held`).

Each stands for an ORM call it names (``ANKUSA_STOCK_DJANGO`` runs that call instead) and changes a
command only under the same condition: a start needs the command ``queued`` at the attempt before, a
finish needs it ``dispatching`` at that attempt, so a stale or duplicate send changes nothing.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import F, Q

from ankusa_site.core.prepared import execute_prepared
from ankusa_site.core.stock import stock
from commands.dispatch.sends import WORKER_LOST, Sent
from commands.models import Attempt, Command, Connector
from commands.states import Event, State, next_state


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
    sql, params = _attempt_rows(sent)
    if connection.vendor == "postgresql":
        execute_prepared(connection, sql, params)
        return
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def finish_with_attempts(sent: list[Sent], attempt: int, event: str, now: datetime, changes: dict) -> int:
    """:func:`finish_sends` for the commands of ``sent`` (one group: the same attempt, event and
    changes), and their attempt rows (:func:`insert_attempts`) if every one moved; returns how many
    moved. (On PostgreSQL the recorder writes a whole batch with :func:`finish_in_one`.)"""
    moved = finish_sends([one.command.pk for one in sent], attempt, event, now, changes)
    if moved == len(sent):
        insert_attempts(sent)
    return moved


def finish_in_one(
    groups: list[tuple[list[Sent], int, str, dict]],
    now: datetime,
    writes: list[tuple[str, list]],
    done: tuple[str, list] | None,
    look: list[int],
) -> tuple[list[int], list[int], list[int]]:
    """PostgreSQL: a recorded batch in one statement (one round trip, whatever the batch holds):
    :func:`finish_with_attempts` at ``now`` of each group ``(sent, attempt, event, changes)``, each
    of ``writes`` and ``done`` (``(sql, params)``: data-modifying statements of other tables,
    ``done`` one that ends ``RETURNING id``) and :func:`failing_or_held` of ``look``.

    Returns how many of each group moved, the ids ``done`` returned (none without it), and the
    connectors failing or held. Every part runs whether a group came back short or not: the
    caller's transaction must roll the statement back then (its parts read the snapshot the
    statement started with, so the look sees no write of theirs: none writes a connector).
    """
    parts: list[str] = []
    params: list = []
    for n, (group, attempt, event, changes) in enumerate(groups):
        finish_sql, finish_params = finish_statement(
            [one.command.pk for one in group], attempt, event, now, changes, connection
        )
        insert_sql, insert_params = _attempt_rows(group)
        parts.append(f"moved_{n} AS ({finish_sql} RETURNING id)")
        parts.append(f"attempts_{n} AS ({insert_sql} WHERE r.command_id IN (SELECT id FROM moved_{n}))")
        params += finish_params + insert_params
    for n, (sql, write_params) in enumerate(writes):
        parts.append(f"write_{n} AS ({sql})")
        params += write_params
    parts.append(f"done AS ({done[0] if done else 'SELECT NULL::bigint AS id WHERE false'})")
    params += done[1] if done else []
    counts = ", ".join(f"(SELECT count(*) FROM moved_{n})" for n in range(len(groups)))
    sql = (
        f"WITH {', '.join(parts)} SELECT ARRAY[{counts}]::integer[], ARRAY(SELECT id FROM done),"
        f" ARRAY({FAILING_OR_HELD_SQL})"
    )
    # psycopg parses a statement longer than 4 KiB again at every call (it caches shorter ones):
    # a batch of one group stays under that (the health upserts alias their tables, the attempt
    # insert selects *); two groups, a batch of successes and failures, go over.
    (row,), _ = execute_prepared(connection, sql, [*params, look])
    return row[0], row[1], row[2]


def _attempt_rows(sent: list[Sent]) -> tuple[str, list]:
    """The INSERT of ``sent``'s attempt rows on this connection, and its one parameter."""
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
    return sql, [json.dumps(rows, default=_json_value)]


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
        types = ", ".join(f"{quote(field.attname)} {field.db_type(connection)}" for field in fields)
        source = f"SELECT * FROM jsonb_to_recordset(%s::jsonb) AS r({types})"  # r: the columns in order
    else:
        picks = ", ".join(f"json_extract(value, '$.{field.attname}')" for field in fields)
        source = f"SELECT {picks} FROM json_each(%s)"
    columns = ", ".join(quote(field.column) for field in fields)
    others = [field for field in fields if field.attname not in ATTEMPT_FIELDS]
    return f"INSERT INTO {Attempt._meta.db_table} ({columns}) {source}", others


def _json_value(value):
    """A value JSON has no type for, as the database reads it from text (a timestamp: ISO 8601)."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


# The connectors of a recorded batch whose outage run or hold a success or another failure may end:
# the recorder asks it of every batch with an outcome other than "again" (most batches), and
# the queryset's compilation cost about as much as the rest of a small batch's Python (measured).
FAILING_OR_HELD_SQL = (
    f"SELECT id FROM {Connector._meta.db_table}"
    " WHERE id = ANY(%s::bigint[]) AND (outage_failures > 0 OR held_since IS NOT NULL)"
)


def failing_or_held(ids: list[int]) -> list[int]:
    """Of the connectors ``ids``, those counting an outage run or held (``commands.dispatch.hold``):
    on PostgreSQL a prepared statement, elsewhere the queryset it stands for."""
    if connection.vendor != "postgresql" or stock("sql"):  # stock: ANKUSA_STOCK_DJANGO
        rows = Connector.objects.filter(Q(outage_failures__gt=0) | Q(held_since__isnull=False), pk__in=ids)
        return list(rows.values_list("pk", flat=True))
    return [pk for (pk,) in execute_prepared(connection, FAILING_OR_HELD_SQL, [ids])[0]]


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


@dataclass(frozen=True)
class _Loaded:
    """One model's part of :func:`load_for_sending`'s rows: its attribute names, and
    ``(position, field, converter)`` for each converter a field has (as the ORM applies them to
    loaded rows: the JSON fields' decoding)."""

    names: list[str]
    decode: list[tuple]

    @classmethod
    def of(cls, fields: list) -> _Loaded:
        decode = [
            (i, f, convert) for i, f in enumerate(fields) for convert in f.get_db_converters(connection)
        ]
        return cls([f.attname for f in fields], decode)

    def instance(self, model, values: list):
        for i, f, convert in self.decode:
            values[i] = convert(values[i], f, connection)
        return model.from_db(connection.alias, self.names, values)


@functools.cache
def _sending_fields() -> tuple[_Loaded, _Loaded, str]:
    """What :func:`load_for_sending` reads of a command and of its connector, and its PostgreSQL
    statement (a join: the connector comes in the same round trip)."""
    fields = [f for f in Command._meta.concrete_fields if f.name not in BOOKKEEPING_FIELDS]
    connector_fields = list(Connector._meta.concrete_fields)
    quote = connection.ops.quote_name
    columns = ", ".join(
        [f"c.{quote(f.column)}" for f in fields] + [f"k.{quote(f.column)}" for f in connector_fields]
    )
    sql = (
        f"SELECT {columns} FROM {Command._meta.db_table} c"
        f" JOIN {Connector._meta.db_table} k ON k.id = c.connector_id WHERE c.id = ANY(%s::bigint[])"
    )
    return _Loaded.of(fields), _Loaded.of(connector_fields), sql


def load_for_sending(ids: list[int]) -> dict[int, Command]:
    """The commands ``ids`` by id, without ``BOOKKEEPING_FIELDS`` (deferred), each with its
    connector (one instance per connector), in one query.

    On PostgreSQL a prepared statement whose rows become instances directly (``Model.from_db``, the
    ORM's own constructor for loaded rows): the querysets' compilation and their per-row iterator
    cost more CPU than the query, once per claimed batch — the connectors' own query alone cost
    more than the commands' (a connector has some forty fields). Elsewhere the queryset.
    """
    if not ids:  # a drain's empty claim: no round trip (under steady load, one every 10 ms)
        return {}
    if connection.vendor != "postgresql" or stock("sql"):  # stock: ANKUSA_STOCK_DJANGO
        loaded = Command.objects.defer(*BOOKKEEPING_FIELDS).select_related("connector").in_bulk(ids)
        shared: dict[int, Connector] = {}
        for command in loaded.values():
            command.connector = shared.setdefault(command.connector_id, command.connector)
        return loaded
    command_part, connector_part, sql = _sending_fields()
    width = len(command_part.names)
    commands: dict[int, Command] = {}
    connectors: dict[int, Connector] = {}
    for row in execute_prepared(connection, sql, [ids])[0]:
        command = command_part.instance(Command, list(row[:width]))
        connector = connectors.get(command.connector_id)
        if connector is None:
            connector = connectors[command.connector_id] = connector_part.instance(
                Connector, list(row[width:])
            )
        command.connector = connector
        commands[command.pk] = command
    return commands
