"""``LocalStore``: the store in this process's memory (``scope: node``, and the fleet store's fallback).

Thread-safe: one lock around each call, which only does dictionary work, so a call never waits on
anything but other calls of this process. Time comes from ``clock`` (µs since the epoch, wall
clock like Redis ``TIME``), injected in tests.

Claims expire by their own deadline (``expires_us``) and are dropped lazily from a heap of
deadlines, so memory follows the live claims. ``max_claims`` bounds it: past it the claim closest
to its deadline is forgotten first (the database's unique constraint still refuses that duplicate).

Not guaranteed: anything beyond this process. Two gunicorn workers are two stores, so with
``scope: node`` a site of W workers admits up to W × the limit and dedupes per worker.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from limits import gcra
from limits.store.base import (
    Charge,
    Claim,
    Duplicate,
    Exceeds,
    Ok,
    Pending,
    RateLimited,
    Result,
    Store,
    check_distinct,
)

# A claim takes about 200 bytes: 72 h of committed keys at 10 events/s would be ~500 MB unbounded.
DEFAULT_MAX_CLAIMS = 1_000_000


def wall_clock_us() -> int:
    return time.time_ns() // 1000


@dataclass
class _Held:
    committed: bool
    expires_us: int
    token: str
    command_id: str


class LocalStore(Store):
    def __init__(self, *, clock: Callable[[], int] = wall_clock_us, max_claims: int = DEFAULT_MAX_CLAIMS):
        self.clock = clock
        self.max_claims = max_claims
        self._lock = threading.Lock()
        self._tats: dict[tuple[str, str], int] = {}
        self._claims: dict[tuple[str, str, str], _Held] = {}
        self._deadlines: list[tuple[int, tuple[str, str, str]]] = []
        self._sweep_at = 1024

    def hit(self, charges: list[Charge], claim: Claim | None = None, timeout_ms: int | None = None) -> Result:
        check_distinct(charges)
        buckets = [(charge.tenant, charge.kind) for charge in charges]
        with self._lock:
            now = self.clock()
            self._expire(now)
            verdict = gcra.charge(
                [self._tats.get(bucket) for bucket in buckets],
                [(charge.cost_us, charge.capacity_us) for charge in charges],
                now,
            )
            if verdict.exceeds is not None:
                return Exceeds(charges[verdict.exceeds].kind)
            debts = tuple(max(0, tat - now) for tat in verdict.tats)
            if not verdict.admitted:
                return RateLimited(verdict.retry_after_ms, debts)
            if claim is not None:
                held = self._claims.get(_claim_key(claim))
                if held is not None:
                    if held.committed:
                        return Duplicate(held.command_id)
                    return Pending(-(-(held.expires_us - now) // 1000))
                self._hold(
                    claim, _Held(False, now + claim.pending_ttl_ms * 1000, claim.token, claim.command_id)
                )
            self._tats.update(zip(buckets, verdict.tats, strict=True))
            return Ok(debts)

    def settle(
        self, claim: Claim, committed: bool, timeout_ms: int | None = None, *, command_id: str | None = None
    ) -> bool:
        with self._lock:
            now = self.clock()
            self._expire(now)
            held = self._claims.get(_claim_key(claim))
            if held is None or held.token != claim.token:
                return False
            if committed:
                self._hold(
                    claim, _Held(True, now + claim.ttl_ms * 1000, held.token, command_id or held.command_id)
                )
            else:
                del self._claims[_claim_key(claim)]
            return True

    def reset(self, tenant: str, timeout_ms: int | None = None) -> bool:
        with self._lock:
            for bucket in [bucket for bucket in self._tats if bucket[0] == tenant]:
                del self._tats[bucket]
        return True

    def _hold(self, claim: Claim, held: _Held) -> None:
        key = _claim_key(claim)
        self._claims[key] = held
        heapq.heappush(self._deadlines, (held.expires_us, key))
        while len(self._claims) > self.max_claims:
            self._drop_earliest()

    def _expire(self, now: int) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            self._drop_earliest()
        # A bucket whose TAT has passed is full, the same as no entry: forget those now and then
        # (when the table has doubled), so the sweep costs O(1) per call on average.
        if len(self._tats) > self._sweep_at:
            self._tats = {bucket: tat for bucket, tat in self._tats.items() if tat > now}
            self._sweep_at = max(1024, 2 * len(self._tats))

    def _drop_earliest(self) -> None:
        expires_us, key = heapq.heappop(self._deadlines)
        held = self._claims.get(key)
        # A settled claim left its old deadline in the heap: only the current one removes it.
        if held is not None and held.expires_us == expires_us:
            del self._claims[key]


def _claim_key(claim: Claim) -> tuple[str, str, str]:
    return (claim.tenant, claim.source_id, claim.key)
