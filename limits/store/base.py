"""The store contract (seed: ``Ankusa.RateLimiter.Store``): a tenant's quota and an event claim in one call.

``hit(charges, claim, timeout_ms)`` charges every GCRA bucket in ``charges`` and, when ``claim``
is given, claims its event key — in one call (one Redis round trip for the fleet store):

* the charges are all or nothing and are checked **before** the claim: a denied charge answers
  ``RateLimited(ms)`` and writes nothing; a charge larger than its bucket's whole capacity answers
  ``Exceeds(kind)`` (the intake's 413), never "retry";
* a claim already taken answers ``Duplicate(command_id)`` when it is committed and
  ``Pending(ms)`` while its holder has not committed yet, and **spends no charge**;
* ``Ok`` means every charge was taken and the claim, if any, is now this caller's, pending.

Claims are two-phase. ``settle(claim, committed=True)`` (after the database commit) keeps the key
for ``ttl_ms`` so duplicates are refused; ``settle(claim, committed=False)`` (the commit failed)
releases it. Only the holder's ``token`` settles. ``settle_many`` settles many claims in one call
(one round trip for Redis); a store that says ``settles_after_answer`` is settled that way, after
the answer, by ``limits.store.settling``. A holder that dies leaves its claim to expire
after ``pending_ttl_ms``. ``Duplicate`` is a 2xx to the sender, so it is only ever given for a
committed claim: a 2xx for a command nobody stored would be a lost command.

Failure is a value: a store that cannot answer in time returns ``Error(reason)``, never raises,
and never takes longer than ``timeout_ms`` (a hard limit, not a hint).

What this contract does not promise: exactly-once admission across a Redis outage (the fleet store
then answers from each node's own state, so a fleet of N nodes admits up to N × the limit, and a
claim taken in Redis just before it went away is not seen). The database's unique constraint on
the event key is the last guard.
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field

CLAIM_TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# The kinds of bucket a tenant has (``limits.models.Kind`` names them for people).
KINDS = ("hooks", "bytes")


@dataclass(frozen=True)
class Charge:
    """One GCRA bucket to charge: ``kind`` (``hooks``/``bytes``) of ``tenant``, cost and capacity in µs."""

    kind: str
    tenant: str
    cost_us: int
    capacity_us: int


@dataclass(frozen=True)
class Claim:
    """An event key to claim, scoped by tenant and source, held by ``token`` for ``command_id``.

    ``ttl_ms``: how long a committed claim refuses duplicates. ``pending_ttl_ms``: how long an
    uncommitted one blocks the key when its holder dies. The token is a random value the holder
    keeps: only it can settle the claim.
    """

    tenant: str
    source_id: str
    key: str
    command_id: str
    token: str
    ttl_ms: int
    pending_ttl_ms: int

    def __post_init__(self):
        if not CLAIM_TOKEN_PATTERN.match(self.token):
            raise ValueError("token: use 1 to 64 letters, digits, '-' or '_'.")
        if self.ttl_ms < 1 or self.pending_ttl_ms < 1:
            raise ValueError("ttl_ms and pending_ttl_ms must be positive.")


@dataclass(frozen=True)
class Ok:
    """Every charge taken, the claim (if any) is this caller's. ``debts_us[i]``: how far charge
    ``i``'s bucket is now ahead of the clock (what the RateLimit headers are computed from)."""

    debts_us: tuple[int, ...] = ()


@dataclass(frozen=True)
class Duplicate:
    """The event key is claimed and committed by ``command_id``."""

    command_id: str


@dataclass(frozen=True)
class Pending:
    """The event key is claimed by a holder that has not committed yet: retry after this long."""

    retry_after_ms: int


@dataclass(frozen=True)
class RateLimited:
    """A charge was denied and nothing was written: it would pass after ``retry_after_ms``."""

    retry_after_ms: int
    debts_us: tuple[int, ...] = ()


@dataclass(frozen=True)
class Exceeds:
    """The charge of ``kind`` is larger than its bucket's whole capacity: it can never pass."""

    kind: str


@dataclass(frozen=True)
class Error:
    """The store did not answer (in time): the caller decides what to do without it."""

    reason: str = field(default="")


Result = Ok | Duplicate | Pending | RateLimited | Exceeds | Error


@dataclass(frozen=True)
class Settle:
    """One settle of ``settle_many``: the claim, commit or release, the id to keep."""

    claim: Claim
    committed: bool
    command_id: str | None = None


class Store(abc.ABC):
    """What every store implements. ``timeout_ms`` defaults to the store's own budget."""

    @abc.abstractmethod
    def hit(self, charges: list[Charge], claim: Claim | None = None, timeout_ms: int | None = None) -> Result:
        """Charge every bucket and claim the key, in one call; see the module docstring."""

    @abc.abstractmethod
    def settle(
        self, claim: Claim, committed: bool, timeout_ms: int | None = None, *, command_id: str | None = None
    ) -> bool | Error:
        """Commit (keep ``ttl_ms``) or release the claim; False when ``claim.token`` no longer holds it.

        ``command_id``, when committing, replaces the id given at claim time: what a ``Duplicate``
        answers from then on (the stored row's id, when it is only known after the insert).
        """

    # Whether a settle costs a round trip: then the intake answers first and settles after the
    # answer, many settles of a process in one call (``settle_many``, ``limits.store.settling``).
    settles_after_answer: bool = False

    def settle_many(self, settles: list[Settle], timeout_ms: int | None = None) -> list[bool | Error]:
        """``settle`` each of ``settles``, in one call where the store can (one round trip for the
        fleet store); each one's answer, in order. A store that cannot answer in time answers
        ``Error`` for those it did not settle. This default settles them one by one."""
        return [
            self.settle(one.claim, one.committed, timeout_ms, command_id=one.command_id) for one in settles
        ]

    def hit_and_settle(
        self, charges: list[Charge], claim: Claim | None, settles: list[Settle], timeout_ms: int | None = None
    ) -> tuple[Result, list[bool | Error]]:
        """``settle_many(settles)``, then ``hit(charges, claim)``: in one call where the store can
        (the fleet store: one round trip, so waiting settles ride on a request's own hit). This
        default makes the two calls."""
        answers = self.settle_many(settles, timeout_ms) if settles else []
        return self.hit(charges, claim, timeout_ms), answers

    @abc.abstractmethod
    def reset(self, tenant: str, timeout_ms: int | None = None) -> bool | Error:
        """Forget ``tenant``'s buckets (its limit changed), best effort; claims are kept."""


def check_distinct(charges: list[Charge]) -> None:
    """A call charges each bucket at most once (GCRA's all-or-nothing is per bucket)."""
    buckets = {(charge.tenant, charge.kind) for charge in charges}
    if len(buckets) != len(charges):
        raise ValueError("Each bucket (tenant, kind) may be charged once per call.")
