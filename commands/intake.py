"""Intake: the one function both front doors call — a webhook (``commands.hooks``) and a REST
submission (``commands.intake_api``) — to turn an authenticated request into stored commands.

``submit(arrival)``: one store call (quota charges and the dedupe claim together; a refusal there
spends and stores nothing), one write (the delivery, its commands, and for those born ``approved``
the sweep's own move to ``queued`` with its queue item), then a 202 and the claim settled as
committed (with the fleet store after the answer, in one round trip with the process's other
settles; until it lands a duplicate is answered 409, its retry 200). Guaranteed: a 2xx is never
given for something that is not stored — 202 follows a returned commit, and a duplicate answer
comes from a claim settled after a commit or from the database's unique constraint (a delivery's
``(tenant, source, event_key)``, an API command's ``(tenant, idempotency_key)``) with the stored
original read back. A failed write releases the claim and answers 503 saying only what is known
("nothing was stored", or "the outcome is unknown").

Not guaranteed: a node that dies while its statement waits may still have it stored (PostgreSQL
finishes an autocommitted statement whose client is gone; the provider's retry is then a
duplicate, stored once); a ``queued`` command's item on a Redis queue follows the commit (the
dispatch loop's recovery gives one to a command that has none). Authentication, signatures and
parsing are the endpoints'. The steps in full: docs/design.md, *Intake*. The module ends with what
both endpoints share at the HTTP level (``read_body``, ``parse_json``, ``refusal``, ``measured``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.models import JSONField, Value
from django.utils import timezone

from ankusa_site.core import metrics
from ankusa_site.core.logs import log_event
from ankusa_site.core.middleware import body_encoding_problem, is_chunked, late, late_detail
from ankusa_site.core.prepared import execute_prepared
from ankusa_site.core.stock import stock
from commands import dispatch
from commands.models import Command, Delivery, Source
from commands.states import Event, State, next_state
from limits import admission
from limits.models import Tenant
from limits.quotas import EffectiveLimit
from limits.store import Duplicate, Exceeds, Ok, Pending, RateLimited, Store

logger = logging.getLogger("ankusa.intake")

# Claims are scoped by (tenant, source id). Sources are numbered; API submissions share this one.
API_CLAIM_SCOPE = "api"
# What a claim answers with before its holder knows the stored row's id (settle replaces it).
UNKNOWN_ID = "pending"


@dataclass(frozen=True)
class Arrival:
    """An authenticated request, parsed: what to store if the tenant's quota and the claim allow.

    ``connectors``: ``(id, idempotent)`` of each connector to make a command for. ``dedupe_key``:
    the event key (webhooks) or ``Idempotency-Key`` (REST), already normalised; None: no dedupe.
    ``claim_key``: what the claim is taken on when it is not ``dedupe_key`` (a body's digest).
    ``source``/``headers``/``body``: a webhook's (a delivery is stored); None for REST.
    ``limits``: the tenant's effective limits when the caller keeps them (None: read them).
    """

    tenant: Tenant
    connectors: list[tuple[int, bool]]
    payload: Any
    size: int
    dedupe_key: str | None = None
    claim_key: str | None = None
    source: Source | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: str | None = None
    limits: dict[str, EffectiveLimit] | None = None

    @property
    def is_webhook(self) -> bool:
        return self.source is not None

    @property
    def claim_scope(self) -> str:
        return str(self.source.pk) if self.source is not None else API_CLAIM_SCOPE


# --- outcomes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stored:
    """A command as intake stored it: what the answers name."""

    pk: int
    connector_id: int
    state: str
    created_at: datetime


@dataclass(frozen=True)
class Accepted:
    """Stored: ``id`` is the delivery's (webhook) or the command's (REST)."""

    id: int
    commands: list[Stored]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Duplicated:
    """Stored before, by the request whose row has ``id``."""

    id: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class InFlight:
    """Another request holds the key and has not committed yet: retry after this long."""

    retry_after_ms: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Limited:
    retry_after_ms: int
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TooLarge:
    kind: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Unavailable:
    """Nothing was stored (the transaction failed, or the store could not answer): retry."""

    reason: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Unknown:
    """The write that commits was sent and no answer came back: it may or may not be stored.
    ``deduped``: whether a retry would be answered as a duplicate if it was."""

    deduped: bool
    webhook: bool
    headers: dict[str, str] = field(default_factory=dict)


Outcome = Accepted | Duplicated | InFlight | Limited | TooLarge | Unavailable | Unknown


# --- submit --------------------------------------------------------------------------------------


def submit(arrival: Arrival, *, now: datetime | None = None, store: Store | None = None) -> Outcome:
    """Admit ``arrival`` under its tenant's quota and claim, store it, settle the claim."""
    now = now or timezone.now()
    claim = None
    claimed = arrival.claim_key or arrival.dedupe_key
    if claimed is not None:
        claim = admission.new_claim(arrival.tenant, arrival.claim_scope, claimed, UNKNOWN_ID)
    decision = admission.admit(
        arrival.tenant, arrival.size, claim, store=store, now=now, limits=arrival.limits
    )
    headers = decision.headers()
    match decision.result:
        case RateLimited(retry_after_ms=ms):
            return Limited(ms, headers)
        case Exceeds(kind=kind):
            return TooLarge(kind, headers)
        case Pending(retry_after_ms=ms):
            return InFlight(ms, headers)
        case Duplicate(command_id=stored_id):
            return Duplicated(int(stored_id), headers)
        case Ok():
            pass
        case _:  # Error: only a node-scope store in trouble says it; nothing was charged or claimed
            return Unavailable(f"the quota store did not answer: {decision.result.reason}", headers)

    committed: list = []
    write = _Write()
    try:
        record_id, commands = _store(arrival, now, committed, write)
    except IntegrityError:
        # The database's last guard: the key is stored already (another node claimed it from its own
        # memory, or the claim expired). Answer with the stored original, if it can be read.
        original = _stored_original(arrival)
        if original is None:
            _settle(claim, store, committed=False)
            return Unavailable("the database refused it", headers)
        _settle(claim, store, committed=True, record_id=original)
        return Duplicated(original, headers)
    except Exception as exc:
        if committed:
            # Stored; only a queue write after the commit failed (a Redis queue). The command waits
            # as queued, and the dispatch loop's recovery gives it an item.
            _log_failure("intake_enqueue_failed", arrival, exc, logging.WARNING)
            record_id, commands = committed[0]
        else:
            # Released even when the write may be stored: a retry then inserts again, and the
            # unique constraint answers it as a duplicate of the stored row.
            _settle(claim, store, committed=False)
            if write.sent and not _refused_by_database(exc):
                _log_failure("intake_outcome_unknown", arrival, exc, logging.ERROR)
                return Unknown(arrival.dedupe_key is not None, arrival.is_webhook, headers)
            _log_failure("intake_commit_failed", arrival, exc, logging.ERROR)
            reason = (
                "the database did not store it" if write.connected else "the database could not be reached"
            )
            return Unavailable(reason, headers)
    _settle(claim, store, committed=True, record_id=record_id)
    return Accepted(record_id, commands, headers)


class _Write:
    """How far a write got: ``connected`` once the database was reached, ``sent`` once the
    statement that commits has gone to it."""

    connected = False
    sent = False


def _refused_by_database(exc: Exception) -> bool:
    """Whether ``exc`` is the database's own answer to the write (so it did not commit), rather
    than a connection that broke before the answer came."""
    if connection.vendor == "sqlite":  # in-process: any error is the database's answer
        return True
    sqlstate = getattr(exc.__cause__, "sqlstate", None)  # psycopg's error, which Django's wraps
    # None: no answer (the connection broke); 08: a connection failure; 57P: the server shut down.
    return sqlstate is not None and not sqlstate.startswith(("08", "57P"))


def _connect() -> None:
    """Django's connection, checked and open: a failure here happens before anything is sent."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()


def _log_failure(event: str, arrival: Arrival, exc: Exception, level: int) -> None:
    log_event(
        logger,
        event,
        level=level,
        tenant=arrival.tenant.slug,
        source=arrival.source.slug if arrival.source is not None else API_CLAIM_SCOPE,
        error=f"{type(exc).__name__}: {exc}"[:300],
    )


def _store(arrival: Arrival, now: datetime, committed: list, write: _Write) -> tuple[int, list[Stored]]:
    """The delivery, its commands and their queue items, in one transaction. ``write.sent`` is set
    as the statement that commits goes out."""
    state = arrival.source.initial_state if arrival.source is not None else State.APPROVED
    queue = dispatch.commands_queue()
    born = [_birth(state, idempotent, now) for _, idempotent in arrival.connectors]
    _connect()
    write.connected = True
    # One statement when the queue can be written by it (ReliableFIFO.enqueue_in_statement), on
    # PostgreSQL, and not under ANKUSA_STOCK_DJANGO (the ORM's writes below are the reference).
    enqueue = queue.enqueue_in_statement(*ITEMS_FROM_COMMANDS, using=connection.alias)
    if enqueue is not None and connection.vendor == "postgresql" and not stock("sql"):
        return _store_in_one_statement(arrival, born, now, enqueue, committed, write)
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
        dispatch.enqueue_with_commit(
            queue,
            [
                dispatch.item_payload(command.pk, attempt)
                for command, (_, attempt) in zip(commands, born, strict=True)
                if attempt is not None
            ],
        )
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


# PostgreSQL, the database queue: the delivery, its commands and their items in ONE statement,
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
    arrival: Arrival, born, now, enqueue: tuple[str, list], committed, write: _Write
) -> tuple[int, list[Stored]]:
    attempts = {attempt for _, attempt in born if attempt is not None}
    if attempts - {1}:  # a new command's first item is attempt 1; anything else is a bug
        raise RuntimeError(f"unexpected attempt numbers at birth: {attempts}")
    enqueue, enqueue_params = enqueue
    sql = _one_statement(arrival.is_webhook, enqueue)
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
    params += [json.dumps(command_rows), *enqueue_params, State.QUEUED.value]
    # Outside a transaction the statement commits by itself: one round trip, no BEGIN or COMMIT.
    with transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext():
        write.sent = True
        rows, _ = execute_prepared(connection, sql, params)
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
    return record_id, stored


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

    A draft stays a draft. An approved one gets the sweep's decision (``dispatch.decide_for``) on a
    never-sent command — which always takes it: a first attempt needs neither backoff nor
    idempotency — and the sweep's move to ``queued`` with it, applied at birth rather than by a
    conditional update, since no other worker can see the row yet.
    """
    if state != State.APPROVED:
        return {"state": state, "state_changed_at": now}, None
    decision = dispatch.decide_for(
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


def _stored_original(arrival: Arrival) -> int | None:
    """The id of the row that holds ``arrival``'s dedupe key already (after a refused insert)."""
    if arrival.dedupe_key is None:
        return None
    if arrival.is_webhook:
        rows = Delivery.objects.filter(
            tenant=arrival.tenant, source=arrival.source, event_key=arrival.dedupe_key
        )
    else:
        rows = Command.objects.filter(
            tenant=arrival.tenant, source__isnull=True, idempotency_key=arrival.dedupe_key
        )
    try:
        return rows.values_list("pk", flat=True).first()
    except DatabaseError:
        return None


def _settle(claim, store: Store | None, *, committed: bool, record_id: int | None = None) -> None:
    if claim is not None:  # after the answer when the store's settle is a round trip (fleet)
        admission.settle_after_answer(claim, committed, command_id=record_id, store=store)


# --- what both endpoints share at the HTTP level ------------------------------------------------


@dataclass(frozen=True)
class Refusal:
    """A request refused before or by ``submit``: status, ``{"error", "detail"}`` and headers."""

    status: int
    code: str
    detail: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def data(self) -> dict:
        return {"error": self.code, "detail": self.detail}


def retry_after_s(ms: int) -> str:
    """``Retry-After`` in whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(ms / 1000)))


def refusal(outcome: Outcome) -> Refusal | None:
    """The answer to an outcome that stored nothing (None for ``Accepted`` and ``Duplicated``)."""
    match outcome:
        case Limited(retry_after_ms=ms, headers=headers):
            return Refusal(
                429,
                "rate_limited",
                "The tenant's quota is spent; retry after the time in Retry-After.",
                {**headers, "Retry-After": retry_after_s(ms)},
            )
        case TooLarge(kind=kind, headers=headers):
            return Refusal(413, "too_large", f"The body can never pass the tenant's {kind} limit.", headers)
        case InFlight(retry_after_ms=ms, headers=headers):
            return Refusal(
                409,
                "in_flight",
                "Another request with this key is being stored; retry after the time in Retry-After.",
                {**headers, "Retry-After": retry_after_s(ms)},
            )
        case Unavailable(reason=reason, headers=headers):
            return Refusal(
                503, "unavailable", f"Nothing was stored ({reason}); retry.", {**headers, "Retry-After": "1"}
            )
        case Unknown(deduped=deduped, webhook=webhook, headers=headers):
            return Refusal(
                503, "unavailable", _unknown_detail(deduped, webhook), {**headers, "Retry-After": "1"}
            )
    return None


def _unknown_detail(deduped: bool, webhook: bool) -> str:
    detail = (
        "The outcome is unknown: the connection to the database broke after the write was sent, "
        "so it may have been stored. "
    )
    if deduped:
        return detail + "Retry: if it was stored, the retry is answered as a duplicate."
    if webhook:
        return detail + "This source does not dedupe its events: a retry may store it a second time."
    return detail + "Without an Idempotency-Key a retry may store it a second time; send one to retry safely."


def measured(endpoint: str):
    """Count a front door's answers by status, the declared request size and the time to answer
    (``ankusa_site.core.metrics``: ``ankusa_intake_*{endpoint=...}``)."""

    def wrap(view):
        @functools.wraps(view)
        def counted(request, *args, **kwargs):
            started = time.perf_counter()
            response = view(request, *args, **kwargs)
            metrics.labelled(metrics.INTAKE_RESPONSES, endpoint, str(response.status_code)).inc()
            declared = request.META.get("CONTENT_LENGTH") or ""
            if declared.isdigit():
                metrics.labelled(metrics.INTAKE_REQUEST_BYTES, endpoint).observe(int(declared))
            metrics.labelled(metrics.INTAKE_LATENCY, endpoint).observe(time.perf_counter() - started)
            return response

        return counted

    return wrap


def read_body(request, limit: int, *, endpoint: str) -> bytes | Refusal:
    """The request body, never reading more than ``limit`` + 1 bytes of it.

    A ``Content-Length`` over the limit is refused before anything is read. A chunked body (no
    ``Content-Length``; Django's own stream would read nothing) is read from the server's input
    stream, only up to the limit. What was read is counted in ``ankusa_intake_body_bytes``.

    A body that does not arrive within ``ANKUSA_BODY_TIMEOUT_S`` (under gunicorn:
    ``ankusa_site.core.middleware``) is a 408, and its connection reads no more.
    """
    try:
        body = _read(request, limit)
    except Exception:
        if not late(request):
            raise
        body = None
    if late(request):  # whatever came of the read: its end was the deadline's
        return Refusal(408, "request_timeout", late_detail())
    if isinstance(body, Refusal):
        return body
    metrics.labelled(metrics.INTAKE_BODY_BYTES, endpoint).observe(len(body))
    if len(body) > limit:
        return Refusal(413, "too_large", f"The body is larger than this tenant's {limit} bytes.")
    return body


def _read(request, limit: int) -> bytes | Refusal:
    if problem := body_encoding_problem(request.META):
        return Refusal(415, "unsupported_media_type", problem)
    if is_chunked(request.META):
        try:
            return _read_chunked(request.META["wsgi.input"], limit)
        except Exception:  # each WSGI server has its own errors for a malformed or cut-off chunk
            return Refusal(400, "bad_request", "The chunked body is malformed or was cut off.")
    declared = (request.META.get("CONTENT_LENGTH") or "0").strip()
    if not (declared.isascii() and declared.isdigit()):
        return Refusal(400, "bad_request", "Content-Length is not a whole number.")
    if int(declared) > limit:
        return Refusal(413, "too_large", f"The body is larger than this tenant's {limit} bytes.")
    try:
        body = request.read(limit + 1)
    except OSError:  # Django's UnreadablePostError: the client went away mid-body
        return Refusal(400, "bad_request", "The body was cut off.")
    if len(body) < int(declared):  # the client closed its side before sending all of it
        return Refusal(
            400, "bad_request", f"The body was cut off: Content-Length is {declared}, {len(body)} bytes came."
        )
    return body


def _read_chunked(stream, limit: int) -> bytes:
    """What the server decoded of a chunked body, at most ``limit`` + 1 bytes of it."""
    chunks, size = [], 0
    while size <= limit:
        chunk = stream.read(min(64 * 1024, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


# Strings that PostgreSQL's jsonb (and text) cannot hold: NUL and lone surrogates ("\ud800").
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Deeper than this is not an event, it is an attack on a recursive parser somewhere downstream.
MAX_JSON_DEPTH = 64


def parse_json(body: bytes) -> tuple[Any, str] | Refusal:
    """``(document, text)`` of a UTF-8 JSON body that every database can store, or why not."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Refusal(400, "bad_encoding", f"The body is not UTF-8 (byte {exc.start}).")
    try:
        document = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        return Refusal(400, "bad_json", f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels.")
    except _TooLarge:
        return Refusal(400, "bad_json", "The JSON holds a number too large to store.")
    except _TooPrecise:
        detail = f"The JSON holds a number with more than {MAX_NUMBER_SCALE} digits after the decimal point."
        return Refusal(400, "bad_json", detail)
    except ValueError as exc:
        return Refusal(400, "bad_json", f"The body is not JSON: {str(exc)[:200]}")
    problem = unstorable(document) if _may_be_unstorable(text) else None
    if problem:
        return Refusal(400, "bad_json", problem)
    return document, text


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class _TooLarge(ValueError):
    pass


class _TooPrecise(ValueError):
    pass


# PostgreSQL's numeric (what jsonb holds a number as) keeps at most this many digits after the
# decimal point: "1e-16384" is valid JSON it refuses ("value overflows numeric format").
MAX_NUMBER_SCALE = 16_383


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999
        raise _TooLarge(literal)
    # Only a negative exponent or a long literal can pass the scale; Decimal is left for those.
    if ("e-" in literal or "E-" in literal or len(literal) > MAX_NUMBER_SCALE) and (
        Decimal(literal).as_tuple().exponent < -MAX_NUMBER_SCALE
    ):
        raise _TooPrecise(literal)
    return value


# What lets parse_json skip the walk of unstorable() on a text, with searches in C: a NUL or a
# lone surrogate can only come from an escape (the decoder refuses them raw), so a text without
# one of these escapes holds none; and the walk's depth limit can only be passed by a text whose
# brackets, outside strings, nest that deep — which needs at least that many opening brackets
# anywhere (counted first: two scans in C, where the nesting takes two substitutions and a walk).
# Either found: the walk decides (a pair of surrogates or an escaped backslash before "u0000" is a
# false alarm it clears).
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}


def _may_be_unstorable(text: str) -> bool:
    if _SUSPECT_ESCAPE.search(text):
        return True
    if text.count("[") + text.count("{") < MAX_JSON_DEPTH:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_NESTING.__getitem__, brackets)), default=0) >= MAX_JSON_DEPTH


def unstorable(document: Any) -> str | None:
    """What in a parsed document a database would refuse, walked without recursion."""
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels."
        if isinstance(node, dict):
            for key, value in node.items():
                if _UNSTORABLE.search(key):
                    return "The JSON holds a NUL character or a lone surrogate, which cannot be stored."
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str) and _UNSTORABLE.search(node):
            return "The JSON holds a NUL character or a lone surrogate, which cannot be stored."
        elif isinstance(node, float) and not math.isfinite(node):
            return "The JSON holds a number too large to store."
    return None
