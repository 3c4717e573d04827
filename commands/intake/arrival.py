"""What intake takes and answers: an :class:`Arrival` (an authenticated request, parsed), the
commands it became (:class:`Stored`) and the :data:`Outcome` of :func:`commands.intake.submit.submit`
— one of ``Accepted``, ``Duplicated``, ``InFlight``, ``Limited``, ``TooLarge``, ``Unavailable``,
``Unknown``. Values only: no database, no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from commands.models import Source
from limits.models import Tenant
from limits.quotas import EffectiveLimit

# Claims are scoped by (tenant, source id). Sources are numbered; API submissions share this one.
API_CLAIM_SCOPE = "api"


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
