"""Connector health, read: the figures of ``commands.health``'s summary for a page of connectors
(:func:`figures`: three queries whatever the number of connectors, attempts or commands), the
worst few (:func:`worst`), and each connector's commands waiting by reason, counted up to ``CAP``
over one range of a partial index per reason. The contract: ``commands.health``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F, Q, Sum
from django.db.models.expressions import RawSQL
from django.utils import timezone

from commands.health import windows
from commands.models.health import (
    BIN_FIELDS,
    BINS,
    HOUR,
    MINUTE,
    SEND_TIME_BOUNDS,
    ConnectorHealth,
    HealthBucket,
)
from commands.retry import SkipReason
from commands.staff.explain import AFTER_FIX, AFTER_FIX_REASONS, NO_REASON, RESEND_PENDING, SKIP_REASONS
from commands.states import State

CAP = 100  # as commands.staff.connector_glance: "more than 100" says what 4,000 would
TO_GO = "to-go"  # approved or queued: not sent yet (connector_glance's "waiting to go")
# The keys waiting commands are counted under, in the failed list's filter order.
WAIT_KEYS = (
    AFTER_FIX,
    *(reason for reason in SkipReason.values if reason in SKIP_REASONS),
    RESEND_PENDING,
    NO_REASON,
)


@dataclass(frozen=True)
class Window:
    sends: int = 0
    ok: int = 0
    bins: tuple[int, ...] = (0,) * BINS

    @property
    def rate(self) -> float | None:
        return self.ok / self.sends if self.sends else None

    def quantile(self, q: float) -> float | None:
        """The upper bound of the bin holding the ``q`` quantile (nearest rank); ``inf`` past the
        last bound; None without sends."""
        if not self.sends:
            return None
        rank, seen = math.ceil(q * self.sends), 0
        for i, n in enumerate(self.bins):
            seen += n
            if seen >= rank:
                return SEND_TIME_BOUNDS[i] if i < len(SEND_TIME_BOUNDS) else math.inf
        return math.inf

    def as_dict(self) -> dict:
        p50, p95 = self.quantile(0.5), self.quantile(0.95)
        return {
            "sends": self.sends,
            "ok": self.ok,
            "success_rate": None if self.rate is None else round(self.rate, 4),
            # The upper bound of the histogram bin; null without sends or past the last bound.
            "p50_s": p50 if p50 is not None and p50 != math.inf else None,
            "p95_s": p95 if p95 is not None and p95 != math.inf else None,
            "p50": seconds_text(p50),
            "p95": seconds_text(p95),
        }


def seconds_text(bound: float | None) -> str:
    if bound is None:
        return "-"
    if bound == math.inf:
        return f"> {SEND_TIME_BOUNDS[-1]:g} s"
    return f"≤ {bound * 1000:g} ms" if bound < 1 else f"≤ {bound:g} s"


@dataclass(frozen=True)
class Health:
    connector_id: int
    hour: Window = Window()
    day: Window = Window()
    consecutive_failures: int = 0
    last_error_class: str = ""
    last_error: str = ""
    last_error_at: datetime | None = None
    last_ok_at: datetime | None = None
    waiting: dict[str, int] = field(default_factory=dict)  # WAIT_KEYS and TO_GO, each up to CAP + 1

    def as_dict(self) -> dict:
        return {
            "connector": self.connector_id,
            "last_hour": self.hour.as_dict(),
            "last_day": self.day.as_dict(),
            "consecutive_failures": self.consecutive_failures,
            "last_error": (
                {"error_class": self.last_error_class, "detail": self.last_error, "at": self.last_error_at}
                if self.last_error_at
                else None
            ),
            "last_ok_at": self.last_ok_at,
            # Counts past CAP read CAP + 1: "more than 100".
            "waiting": {key: n for key, n in self.waiting.items() if n},
            "waiting_capped_at": CAP,
        }


def _capped(ranges: list[str], order: str, key: str = "") -> RawSQL:
    # As connector_glance's counts: sub-selects that each stop at CAP + 1 rows of one range of a
    # partial index (commands_connector_reason_idx for the failed ones: connector, skip reason,
    # outlook), summed; ``order`` is the index's own next column, so the planner walks that range
    # and stops, rather than collecting the connector's whole reason in a bitmap (measured: 300 ms
    # a page at 100,000 failed commands before). A "not this outlook" is two ranges, below and
    # above it. The states are literals so that SQLite can use the partial index; every value
    # here is a constant of this module, never input.
    table = "commands_command c"
    if key == RESEND_PENDING and connection.vendor == "sqlite":
        # A pending resend by its link's own partial index (a handful of rows in all): SQLite's
        # planner would walk the connector's failed commands instead (PostgreSQL's takes it).
        table += " INDEXED BY commands_resend_idx"
    counts = [
        f"(SELECT COUNT(*) FROM (SELECT 1 FROM {table} WHERE c.connector_id = commands_connector.id "
        f"AND {condition} ORDER BY {order} LIMIT {CAP + 1}) capped)"
        for condition in ranges
    ]
    return RawSQL(" + ".join(counts), ())


def _wait_ranges(key: str) -> list[str]:
    """``commands.staff.explain.waiting_for(key)`` for failed commands, as SQL conditions whose rows
    add up to it, each one range of ``commands_connector_reason_idx``."""
    failed = f"c.state = '{State.FAILED.value}'"
    if key == RESEND_PENDING:
        return [f"{failed} AND c.resend_by_id IS NOT NULL"]
    not_resent = "c.resend_by_id IS NULL"
    if key == AFTER_FIX:
        return [
            f"{failed} AND c.skip_reason = '{reason}' AND c.last_outlook = '{AFTER_FIX}' AND {not_resent}"
            for reason in AFTER_FIX_REASONS
        ]
    value = "" if key == NO_REASON else key
    if value in AFTER_FIX_REASONS:
        return [
            f"{failed} AND c.skip_reason = '{value}' AND c.last_outlook {side} '{AFTER_FIX}' AND {not_resent}"
            for side in ("<", ">")
        ]
    return [f"{failed} AND c.skip_reason = '{value}' AND {not_resent}"]


def waiting_annotations() -> dict[str, RawSQL]:
    to_go = f"c.state IN ('{State.APPROVED.value}', '{State.QUEUED.value}')"
    return {
        "w_" + key.replace("-", "_"): _capped(_wait_ranges(key), "c.skip_reason, c.last_outlook", key)
        for key in WAIT_KEYS
    } | {"w_to_go": _capped([to_go], "c.connector_id")}


def figures(connector_ids: Sequence[int], now: datetime | None = None) -> dict[int, Health]:
    """Each connector's :class:`Health` (every id answered, zeros for one that never sent), in
    three queries whatever the number of connectors, attempts or commands."""
    from commands.models import Connector  # models imports this module's tables

    if not connector_ids:
        return {}
    now = now or timezone.now()
    minute_from, hour_from = windows(now)
    sums = {"sends": Sum("sends"), "ok": Sum("ok"), **{name: Sum(name) for name in BIN_FIELDS}}
    rows: list[dict[str, Any]] = list(
        HealthBucket.objects.filter(connector_id__in=connector_ids)
        .filter(Q(span=MINUTE, start__gte=minute_from) | Q(span=HOUR, start__gte=hour_from))
        .order_by()
        .values("connector_id", "span")
        .annotate(**sums)
    )
    spans: dict[tuple[int, int], Window] = {
        (row["connector_id"], row["span"]): Window(
            row["sends"], row["ok"], tuple(row[name] for name in BIN_FIELDS)
        )
        for row in rows
    }
    runs = {row.connector_id: row for row in ConnectorHealth.objects.filter(connector_id__in=connector_ids)}
    annotations = waiting_annotations()
    waits = {
        row["pk"]: row
        for row in Connector.objects.filter(pk__in=connector_ids)
        .annotate(**annotations)
        .values("pk", *annotations)
    }
    found = {}
    for cid in connector_ids:
        run = runs.get(cid)
        counts = waits.get(cid, {})
        found[cid] = Health(
            cid,
            hour=spans.get((cid, MINUTE), Window()),
            day=spans.get((cid, HOUR), Window()),
            consecutive_failures=run.consecutive_failures if run else 0,
            last_error_class=run.last_error_class if run else "",
            last_error=run.last_error if run else "",
            last_error_at=run.last_error_at if run else None,
            last_ok_at=run.last_ok_at if run else None,
            waiting={
                key: min(counts.get("w_" + key.replace("-", "_"), 0), CAP + 1) for key in (*WAIT_KEYS, TO_GO)
            },
        )
    return found


def worst(limit: int, now: datetime | None = None, *, failing_only: bool = True) -> list[tuple]:
    """``(connector, Health)`` of the connectors failing the longest run right now, longest first,
    then the latest failure first (``failing_only=False``: then the others that ever sent)."""
    from commands.models import Connector

    rows = ConnectorHealth.objects.all()
    if failing_only:
        rows = rows.filter(consecutive_failures__gt=0)
    ids = list(
        rows.order_by(
            "-consecutive_failures", F("last_error_at").desc(nulls_last=True), "connector_id"
        ).values_list("connector_id", flat=True)[:limit]
    )
    connectors = Connector.objects.select_related("tenant").in_bulk(ids)
    health = figures(ids, now)
    return [(connectors[cid], health[cid]) for cid in ids if cid in connectors]
