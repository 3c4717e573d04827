"""``submit``: the one function both front doors call — a webhook (``commands.intake.hooks``) and a REST
submission (``commands.intake.rest``) — to turn an authenticated request into stored commands.

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
parsing are the endpoints'. The steps in full: docs/design.md, *Intake*.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import DatabaseError, IntegrityError, connection
from django.utils import timezone

from ankusa_site.core.logs import log_event
from commands.intake.arrival import (
    API_CLAIM_SCOPE,
    Accepted,
    Arrival,
    Duplicated,
    InFlight,
    Limited,
    Outcome,
    TooLarge,
    Unavailable,
    Unknown,
)
from commands.intake.write import _store, _Write
from commands.models import Command, Delivery
from limits import admission
from limits.store import Duplicate, Exceeds, Ok, Pending, RateLimited, Store

logger = logging.getLogger("ankusa.intake")


# What a claim answers with before its holder knows the stored row's id (settle replaces it).
UNKNOWN_ID = "pending"


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


def _refused_by_database(exc: Exception) -> bool:
    """Whether ``exc`` is the database's own answer to the write (so it did not commit), rather
    than a connection that broke before the answer came."""
    if connection.vendor == "sqlite":  # in-process: any error is the database's answer
        return True
    sqlstate = getattr(exc.__cause__, "sqlstate", None)  # psycopg's error, which Django's wraps
    # None: no answer (the connection broke); 08: a connection failure; 57P: the server shut down.
    return sqlstate is not None and not sqlstate.startswith(("08", "57P"))


def _log_failure(event: str, arrival: Arrival, exc: Exception, level: int) -> None:
    log_event(
        logger,
        event,
        level=level,
        tenant=arrival.tenant.slug,
        source=arrival.source.slug if arrival.source is not None else API_CLAIM_SCOPE,
        error=f"{type(exc).__name__}: {exc}"[:300],
    )


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
