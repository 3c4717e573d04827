"""A tenant's effective limits: which limit applies to each kind now, and where it came from.

Precedence (``limits.models`` explains it): active override > the tenant's own > site default >
unlimited. ``effective_limits`` answers both kinds with at most one query (none when the caller
prefetched the active overrides into ``tenant.active_overrides``, as the admin list does).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from limits.gcra import Limit
from limits.models import Kind, LimitOverride, LimitSource, Tenant


@dataclass(frozen=True)
class EffectiveLimit:
    kind: str
    limit: Limit | None  # None: unlimited
    source: str  # a LimitSource value
    override: LimitOverride | None = None

    def describe(self) -> str:
        """``10/s, burst 50 (override)`` — how staff read it."""
        if self.limit is None:
            return "unlimited"
        return f"{self.limit.rate:g}/s, burst {self.limit.burst} ({LimitSource(self.source).label})"


def active_overrides(tenant: Tenant, now: datetime) -> list[LimitOverride]:
    prefetched = getattr(tenant, "active_overrides", None)
    if prefetched is not None:
        return prefetched
    return list(LimitOverride.objects.active(now).filter(tenant=tenant))


def site_default(kind: str) -> Limit | None:
    rate = getattr(settings, f"ANKUSA_DEFAULT_{kind.upper()}_RATE")
    burst = getattr(settings, f"ANKUSA_DEFAULT_{kind.upper()}_BURST")
    return Limit(rate, burst) if rate and burst else None


def effective_limits(tenant: Tenant, now: datetime | None = None) -> dict[str, EffectiveLimit]:
    """Both kinds' effective limits, by kind."""
    now = now or timezone.now()
    overrides = {override.kind: override for override in active_overrides(tenant, now)}
    result = {}
    for kind in Kind.values:
        override = overrides.get(kind)
        own = tenant.own_limit(kind)
        default = site_default(kind)
        if override is not None:
            result[kind] = EffectiveLimit(
                kind, Limit(override.rate, override.burst), LimitSource.OVERRIDE, override
            )
        elif own is not None:
            result[kind] = EffectiveLimit(kind, Limit(*own), LimitSource.TENANT)
        elif default is not None:
            result[kind] = EffectiveLimit(kind, default, LimitSource.DEFAULT)
        else:
            result[kind] = EffectiveLimit(kind, None, LimitSource.UNLIMITED)
    return result


def effective_limit(tenant: Tenant, kind: str, now: datetime | None = None) -> EffectiveLimit:
    """The limit of ``kind`` that applies to ``tenant`` at ``now``, and where it comes from."""
    return effective_limits(tenant, now)[Kind(kind).value]


def max_body_bytes(tenant: Tenant) -> int:
    return tenant.max_body_bytes or settings.ANKUSA_MAX_BODY_BYTES
