"""What the intake calls: one ``admit()`` per request, then ``settle()`` once the command is stored.

::

    claim = admission.new_claim(tenant, source_id, event_key, command_id)   # or None: no dedupe
    decision = admission.admit(tenant, len(body), claim)
    match decision.result:
        case Ok():              store the command; admission.settle_after_answer(claim, committed=…)
                                (with a store whose settle is a round trip, it is made after the
                                answer, batched; a settle the store misses is retried)
        case Duplicate(id):     200 with the original id
        case Pending(ms):       409 + Retry-After
        case RateLimited(ms):   429 + Retry-After
        case Exceeds(kind):     413
        case Error(reason):     only from a node-scope store in trouble; the fleet store never
                                returns it from admit (it falls back to local state)
    response.headers.update(decision.headers())   # RateLimit-Policy / RateLimit

``admit`` reads the tenant's effective limits (one small query for its active overrides; none when
the caller passes them, as the webhook intake does from its kept source configuration), builds
a ``hooks`` charge of 1 and a ``bytes`` charge of the body length, refuses without a round trip a
body larger than the tenant's ``max_body_bytes`` or its whole ``bytes`` burst, and makes one store
call. The RateLimit headers (draft-ietf-httpapi-ratelimit-headers) come from the same answer: no
second call.

What it does not do: look at ``tenant.active`` or authenticate anything — the intake does.
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from ankusa_site.core import metrics
from ankusa_site.core.logs import log_event
from limits.gcra import Limit
from limits.models import Tenant
from limits.quotas import EffectiveLimit, effective_limits, max_body_bytes
from limits.store import Charge, Claim, Error, Exceeds, Ok, RateLimited, Result, Store, get_store, settling

logger = logging.getLogger("ankusa.limits")


@dataclass(frozen=True)
class Quota:
    """One bucket after the call: enough for the RateLimit headers."""

    kind: str
    limit: Limit
    debt_us: int  # how far the bucket is ahead of now

    @property
    def remaining(self) -> int:
        return self.limit.remaining(self.debt_us)

    @property
    def reset_s(self) -> int:
        """Seconds until the bucket is full again."""
        return math.ceil(max(0, self.debt_us) / 1_000_000)


@dataclass(frozen=True)
class Admission:
    result: Result
    quotas: tuple[Quota, ...] = field(default=())

    def headers(self) -> dict[str, str]:
        """``RateLimit-Policy`` and ``RateLimit`` for the limited kinds (nothing when unlimited)."""
        if not self.quotas:
            return {}
        policy = ", ".join(
            f'"{q.kind}";q={q.limit.burst};w={math.ceil(q.limit.window_s)}' for q in self.quotas
        )
        state = ", ".join(f'"{q.kind}";r={q.remaining};t={q.reset_s}' for q in self.quotas)
        return {"RateLimit-Policy": policy, "RateLimit": state}


def new_claim(
    tenant: Tenant,
    source_id: str,
    event_key: str,
    command_id: str,
    *,
    token: str | None = None,
    ttl_ms: int | None = None,
    pending_ttl_ms: int | None = None,
) -> Claim:
    """A claim on ``event_key`` of ``tenant``'s source for ``command_id``, with a fresh token."""
    return Claim(
        tenant=tenant.slug,
        source_id=str(source_id),
        key=event_key,
        command_id=str(command_id),
        token=token or secrets.token_urlsafe(16),
        ttl_ms=ttl_ms or settings.ANKUSA_CLAIM_TTL_MS,
        pending_ttl_ms=pending_ttl_ms or settings.ANKUSA_CLAIM_PENDING_TTL_MS,
    )


def charges_for(
    tenant: Tenant,
    body_bytes: int,
    now: datetime | None = None,
    *,
    limits: dict[str, EffectiveLimit] | None = None,
) -> tuple[list[Charge], list[Limit]] | Exceeds:
    """The charges of one request (and their limits), or ``Exceeds`` when it can never pass.

    ``limits``: the tenant's ``effective_limits`` when the caller read them already (the intake
    keeps them with a source's configuration)."""
    if body_bytes > max_body_bytes(tenant):
        return Exceeds("max_body_bytes")
    charges, kept = [], []
    for kind, effective in (limits if limits is not None else effective_limits(tenant, now)).items():
        units = 1 if kind == "hooks" else body_bytes
        if effective.limit is None or units == 0:
            continue
        if units > effective.limit.burst:
            return Exceeds(kind)
        charges.append(Charge(kind, tenant.slug, effective.limit.cost_us(units), effective.limit.capacity_us))
        kept.append(effective.limit)
    return charges, kept


def admit(
    tenant: Tenant,
    body_bytes: int,
    claim: Claim | None = None,
    *,
    store: Store | None = None,
    now: datetime | None = None,
    limits: dict[str, EffectiveLimit] | None = None,
) -> Admission:
    """Charge the tenant for one request of ``body_bytes`` and take ``claim``, in one store call."""
    built = charges_for(tenant, body_bytes, now, limits=limits)
    if isinstance(built, Exceeds):
        return Admission(built)
    charges, limits = built
    if not charges and claim is None:
        return Admission(Ok())
    store = store or get_store()
    carried = settling.RETRIER.take(store) if _after_answer(store) else []
    if carried:  # this process's settles made after their answers ride on this round trip
        result, answers = store.hit_and_settle(charges, claim, [one.request() for one in carried])
        settling.RETRIER.returned(carried, answers)
    else:
        result = store.hit(charges, claim)
    metrics.labelled(metrics.STORE_CALLS, settings.ANKUSA_STORE_SCOPE, type(result).__name__.lower()).inc()
    if isinstance(result, Ok | RateLimited):
        debts = result.debts_us
        return Admission(
            result, tuple(Quota(c.kind, lim, d) for c, lim, d in zip(charges, limits, debts, strict=True))
        )
    return Admission(result)


def settle(
    claim: Claim, committed: bool, *, command_id: str | int | None = None, store: Store | None = None
) -> bool:
    """Commit (the command is durable) or release (its commit failed) the claim. Whether it did.

    ``command_id``: the id a duplicate is answered with from now on, when it differs from the one
    the claim was made with (a row id known only after the insert). A store that did not answer in
    time hands the settle to this process's retrier (``limits.store.settling``), which tries it
    again off the request path until it lands or the claim's pending TTL makes it moot.
    """
    command_id = None if command_id is None else str(command_id)
    store = store or get_store()
    answer = store.settle(claim, committed, command_id=command_id)
    if isinstance(answer, Error):
        settling.RETRIER.add(store, claim, committed, command_id, answer.reason)
    elif answer is not True:
        log_event(
            logger,
            "claim_settle_failed",
            level=logging.WARNING,
            action="commit" if committed else "release",
            tenant=claim.tenant,
            source=claim.source_id,
            event_key=claim.key[:200],
            reason="no longer held by this token",
        )
    return answer is True


def settle_after_answer(
    claim: Claim, committed: bool, *, command_id: str | int | None = None, store: Store | None = None
) -> None:
    """``settle``, off the request path when the store's settle costs a round trip
    (``settles_after_answer``): handed to this process's settler (``limits.store.settling``), and
    carried by the process's next ``admit`` in its own round trip (or, a moment later, sent by the
    settler with the others waiting, in one). The claim stays pending until then, so
    a duplicate meanwhile is answered 409 ``in_flight``, never 2xx. Other stores (and
    ``ANKUSA_SETTLE_AFTER_ANSWER=0``) settle here, before the answer."""
    store = store or get_store()
    if not _after_answer(store):
        settle(claim, committed, command_id=command_id, store=store)
        return
    settling.RETRIER.add(store, claim, committed, None if command_id is None else str(command_id))


def _after_answer(store: Store) -> bool:
    return store.settles_after_answer and settings.ANKUSA_SETTLE_AFTER_ANSWER
