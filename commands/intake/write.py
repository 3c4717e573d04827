"""Intake's write: an arrival's delivery, its commands and, for those born ``approved``, their move
to ``queued`` with their queue items, in one transaction — on PostgreSQL in one statement (CTEs,
prepared; the Redis queue's items follow its commit), elsewhere by inserts. ``_store`` is what
``submit`` calls; ``_Write`` tells it how far the write got (connected, the committing statement
sent), which decides what a failure may answer.
Each command is born with the sweep's own decision (``commands.lifecycle.decide_for``).
"""

from __future__ import annotations

import contextlib
import functools
import json
from datetime import datetime

from django.db import connection, transaction
from django.db.models import JSONField, Value

from ankusa_site.core.prepared import execute_prepared
from ankusa_site.core.stock import stock
from commands import wake
from commands.intake.arrival import Arrival, Stored
from commands.lifecycle import commands_queue, decide_for, enqueue_with_commit, item_payload
from commands.models import Command, Delivery
from commands.states import Event, State, next_state


class _Write:
    """How far a write got: ``connected`` once the database was reached, ``sent`` once the
    statement that commits has gone to it."""

    connected = False
    sent = False


def _connect() -> None:
    """Django's connection, checked and open: a failure here happens before anything is sent."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()


def _store(arrival: Arrival, now: datetime, committed: list, write: _Write) -> tuple[int, list[Stored]]:
    """The delivery, its commands and their queue items, in one transaction. ``write.sent`` is set
    as the statement that commits goes out."""
    state = arrival.source.initial_state if arrival.source is not None else State.APPROVED
    queue = commands_queue()
    born = [_birth(state, idempotent, now) for _, idempotent in arrival.connectors]
    _connect()
    write.connected = True
    # One statement on PostgreSQL, except under ANKUSA_STOCK_DJANGO (the ORM's writes below are the
    # reference): with the items when the queue can be written by it (ReliableFIFO.
    # enqueue_in_statement), else (the Redis queue) the rows alone, and the items after its commit.
    if connection.vendor == "postgresql" and not stock("sql"):
        enqueue = queue.enqueue_in_statement(*ITEMS_FROM_COMMANDS, using=connection.alias)
        return _store_in_one_statement(arrival, born, now, queue, enqueue, committed, write)
    delivery = None
    if arrival.is_webhook:
        delivery = Delivery(**_delivery_values(arrival, now), body=arrival.body)
    shared = {**_command_values(arrival, now), "payload": arrival.payload}
    commands = [
        Command(**shared, connector_id=connector_id, **fields)
        for (connector_id, _), (fields, _) in zip(arrival.connectors, born, strict=True)
    ]
    with transaction.atomic():
        if delivery is not None:
            insert([delivery])
            for command in commands:
                command.delivery = delivery
        insert(commands)
        record_id = delivery.pk if delivery is not None else commands[0].pk
        stored = [Stored(c.pk, c.connector_id, c.state, c.created_at) for c in commands]
        # Runs first among the commit callbacks: an exception from a later one (the Redis queue's
        # write) then still tells that the rows are stored.
        transaction.on_commit(lambda: committed.append((record_id, stored)))
        enqueue_with_commit(queue, _first_items(stored, born))
        # What is left is the COMMIT (or, within a caller's transaction, nothing of ours): a
        # connection lost before it was sent rolled the transaction back.
        write.sent = True
    return record_id, stored


def _delivery_values(arrival: Arrival, now: datetime) -> dict:
    """A webhook's delivery, but its body."""
    return {
        "tenant_id": arrival.tenant.pk,
        "source_id": arrival.source.pk,
        "event_key": arrival.dedupe_key or "",
        "headers": arrival.headers,
        "size": arrival.size,
        "received_at": now,
    }


def _command_values(arrival: Arrival, now: datetime) -> dict:
    """What every command of ``arrival`` shares but its payload (each adds its connector and state
    fields)."""
    return {
        "tenant_id": arrival.tenant.pk,
        "source_id": arrival.source.pk if arrival.source is not None else None,
        "idempotency_key": arrival.dedupe_key or "",
        "created_at": now,
    }


# PostgreSQL: the delivery, its commands and (the database queue) their items in ONE statement,
# which commits by itself outside a transaction. Each write is a data-modifying CTE; the rows go as
# JSON parameters the server unpacks into the tables' own row types (``jsonb_populate_record``), so
# the driver quotes two strings instead of a parameter per column. Measured against the same
# writes as three statements in a transaction: about 1 ms less CPU per webhook, most of it the
# round trips and Django's transaction handling. A webhook's body goes as text of its own, and is
# also its commands' payload: the server reads the JSON the provider sent, instead of the worker
# encoding the parsed document again and escaping the body into a JSON row.
ONE_STATEMENT = """
WITH {delivery_cte}command AS (
    INSERT INTO {command_table} ({command_columns})
    SELECT {command_values} FROM jsonb_populate_recordset(NULL::{command_table}, %s::jsonb) AS r
    RETURNING id, connector_id, state
), item AS (
    {enqueue}
)
SELECT 'command', id, connector_id FROM command{delivery_select}
"""


# The items of the statement's new queued commands, each its first attempt.
NO_ITEMS = "SELECT 1"  # the queue is not written by the statement (the Redis queue): an unused CTE
ITEMS_FROM_COMMANDS = ("command WHERE state = %s", "jsonb_build_object('command', id, 'attempt', 1)", "id")
DELIVERY_CTE = """delivery AS (
    INSERT INTO {table} ({columns})
    SELECT {values} FROM jsonb_populate_record(NULL::{table}, %s::jsonb)
    RETURNING id
), """


@functools.cache
def _one_statement(webhook: bool, enqueue: str) -> str:
    """The statement of :func:`_store_in_one_statement`."""
    quote = connection.ops.quote_name
    command_fields = [f for f in Command._meta.concrete_fields if not f.primary_key]
    columns = ", ".join(quote(f.column) for f in command_fields)
    # A webhook's commands: the delivery just inserted, and the body as their payload (parameter).
    from_webhook = {"delivery": "(SELECT id FROM delivery)", "payload": "%s::jsonb"} if webhook else {}
    values = ", ".join(from_webhook.get(f.name, f"r.{quote(f.column)}") for f in command_fields)
    delivery_cte = ""
    if webhook:
        delivery_fields = [f for f in Delivery._meta.concrete_fields if not f.primary_key]
        delivery_cte = DELIVERY_CTE.format(
            table=quote(Delivery._meta.db_table),
            columns=", ".join(quote(f.column) for f in delivery_fields),
            values=", ".join("%s" if f.name == "body" else quote(f.column) for f in delivery_fields),
        )
    return ONE_STATEMENT.format(
        delivery_cte=delivery_cte,
        command_table=quote(Command._meta.db_table),
        command_columns=columns,
        command_values=values,
        enqueue=enqueue,
        delivery_select=" UNION ALL SELECT 'delivery', id, NULL FROM delivery" if webhook else "",
    )


@functools.cache
def _defaults(model) -> tuple[dict, list, dict]:
    """What a new row of ``model`` holds unless told otherwise: the constant defaults by column,
    the fields whose default is computed on each call, and each field's column by attribute name.
    What the model's constructor would fill in, without constructing an instance on the hot path
    (measured with callgrind: a fifth of a webhook's instructions)."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    computed = [f for f in fields if f.has_default() and callable(f.default)]
    constant = {f.column: _json_value(f.get_default()) for f in fields if f not in computed}
    return constant, computed, {f.attname: f.column for f in fields}


def _json_row(model, values: dict) -> dict:
    """A new row of ``model`` for ``jsonb_populate_record``: ``values`` (by attribute name) over
    the fields' defaults, datetimes as PostgreSQL reads them. (Converted here rather than by a
    ``default`` hook of ``json.dumps``, which makes it build an encoder per call: 13 µs a row.)"""
    constant, computed, columns = _defaults(model)
    row = dict(constant)
    for f in computed:
        if f.attname not in values:
            row[f.column] = _json_value(f.get_default())
    for attname, value in values.items():
        row[columns[attname]] = _json_value(value)
    return row


def _json_value(value):
    return value.isoformat() if isinstance(value, datetime) else value


def _store_in_one_statement(
    arrival: Arrival, born, now, queue, enqueue: tuple[str, list] | None, committed, write: _Write
) -> tuple[int, list[Stored]]:
    """``enqueue``: the items' SQL for the statement, or None to write them after its commit."""
    attempts = {attempt for _, attempt in born if attempt is not None}
    if attempts - {1}:  # a new command's first item is attempt 1; anything else is a bug
        raise RuntimeError(f"unexpected attempt numbers at birth: {attempts}")
    in_statement = enqueue is not None
    items_sql, items_params = enqueue or (NO_ITEMS, [])
    sql = _one_statement(arrival.is_webhook, items_sql)
    shared = _command_values(arrival, now)
    if not arrival.is_webhook:
        shared["payload"] = arrival.payload
    command_rows = [
        _json_row(Command, {**shared, "connector_id": connector_id, **fields})
        for (connector_id, _), (fields, _) in zip(arrival.connectors, born, strict=True)
    ]
    params = []
    if arrival.is_webhook:  # in the statement's order: the delivery's body and row, the payload
        delivery_row = _json_row(Delivery, _delivery_values(arrival, now))
        params += [arrival.body, json.dumps(delivery_row), arrival.body]
    params += [json.dumps(command_rows), *items_params]
    if in_statement:
        params.append(State.QUEUED.value)  # ITEMS_FROM_COMMANDS' parameter
    # Outside a transaction the statement commits by itself: one round trip, no BEGIN or COMMIT.
    with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
        write.sent = True
        rows, _ = execute_prepared(connection, sql, params)
        if in_statement:
            wake.after_enqueue()  # the statement's NOTIFY wakes the loops; Celery is asked (commands.wake)
    ids = {connector: pk for kind, pk, connector in rows if kind == "command"}
    stored = [
        Stored(ids[connector_id], connector_id, fields["state"], now)
        for (connector_id, _), (fields, _) in zip(arrival.connectors, born, strict=True)
    ]
    if arrival.is_webhook:
        record_id = next(pk for kind, pk, _ in rows if kind == "delivery")
    else:
        record_id = stored[0].pk
    # Committed when the statement returned (or with the caller's transaction, if there is one).
    transaction.on_commit(lambda: committed.append((record_id, stored)))
    if not in_statement:
        # After the callback above, as the ORM's path: a failing queue still tells the rows are stored.
        enqueue_with_commit(queue, _first_items(stored, born))
    return record_id, stored


def _first_items(stored: list[Stored], born) -> list[dict]:
    """The queue items of the stored commands born ``queued``: each its first attempt."""
    return [
        item_payload(one.pk, attempt)
        for one, (_, attempt) in zip(stored, born, strict=True)
        if attempt is not None
    ]


@functools.cache
def _insert_statement(model, rows: int, vendor: str) -> tuple[list, str]:
    fields = [field for field in model._meta.concrete_fields if not field.primary_key]
    quote = connection.ops.quote_name
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES {', '.join([row] * rows)} RETURNING {quote(model._meta.pk.column)}"
    )
    return fields, sql


def insert(objects: list) -> None:
    """``bulk_create`` for the intake's hot path: one ``INSERT … RETURNING`` of new instances of one
    model (defaults already set by their constructor), whose ids it sets.

    The statement is built once per model and row count instead of by the ORM's compiler on every
    call, which costs more CPU than the database's own work (measured: about 0.5 ms a request on
    the 2-core machine). PostgreSQL and SQLite (3.35+) both return the ids in the order inserted.
    """
    if not objects:
        return
    if stock("sql"):  # ANKUSA_STOCK_DJANGO: the ORM's own, which this stands for
        model = type(objects[0])
        for obj in objects:  # a JSON ``null`` document, not SQL's NULL (see _db_value)
            for f in model._meta.concrete_fields:
                if isinstance(f, JSONField) and not f.null and getattr(obj, f.attname) is None:
                    setattr(obj, f.attname, Value(None, JSONField()))
        model.objects.bulk_create(objects)
        return
    fields, sql = _insert_statement(type(objects[0]), len(objects), connection.vendor)
    params = [_db_value(field, getattr(obj, field.attname)) for obj in objects for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [row[0] for row in cursor.fetchall()]
    for obj, pk in zip(objects, ids, strict=True):
        obj.pk = pk
        obj._state.adding = False
        obj._state.db = connection.alias


def _db_value(field, value):
    """``value`` as ``field``'s column takes it. ``None`` in a JSON field that cannot be NULL is the
    JSON document ``null`` (a webhook's body may be just that), not SQL's NULL, which Django's
    ``get_db_prep_save`` makes of it."""
    if value is None and isinstance(field, JSONField) and not field.null:
        return field.get_db_prep_value(None, connection)
    return field.get_db_prep_save(value, connection)


def _birth(state: State, idempotent: bool, now: datetime) -> tuple[dict, int | None]:
    """A new command's state fields, and the attempt number of its queue item (None: no item).

    A draft stays a draft. An approved one gets the sweep's decision (``lifecycle.decide_for``) on a
    never-sent command — which always takes it: a first attempt needs neither backoff nor
    idempotency — and the sweep's move to ``queued`` with it, applied at birth rather than by a
    conditional update, since no other worker can see the row yet.
    """
    if state != State.APPROVED:
        return {"state": state, "state_changed_at": now}, None
    decision = decide_for(
        {
            "state": state,
            "last_outlook": "",
            "attempts": 0,
            "next_attempt_at": None,
            "connector__idempotent": idempotent,
        },
        now,
    )
    fields = {
        "state": next_state(state, Event.DISPATCH),
        "state_changed_at": now,
        "next_attempt_at": decision.next_attempt_at,
        "skip_reason": "",
        "skip_decided_at": now,
    }
    return fields, decision.attempt
