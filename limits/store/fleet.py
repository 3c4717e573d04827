"""``FleetStore`` (``scope: fleet``): Redis first, this node's own state when Redis does not answer.

Every call goes to the ``RedisStore`` with its hard budget. A call that errs or times out is
answered by the ``LocalStore`` instead and counted (``fallbacks``, and the
``ankusa_fleet_fallbacks_total`` metric), so a Redis outage degrades
the limits to per-node ones; it never stops intake.

A circuit breaker keeps an outage from costing the full timeout on every request: after
``threshold`` consecutive failures it *opens* and calls go straight to the local store for
``cooldown_ms``; then one call (only one, whatever the concurrency) probes Redis. A probe that
answers *closes* the breaker; one that fails keeps it open for another cooldown. Each switch is
logged once, as it happens, not per call, and shown as ``ankusa_fleet_breaker_open`` (per process).

Claims follow the store that took them: ``settle`` first asks the local store (a claim taken during
the outage lives there) and otherwise Redis. What is not guaranteed: while the breaker is open,
two nodes can each take the same event key (the database's unique constraint refuses the second
command), and a claim taken in Redis just before the outage is settled only when Redis answers
again (``limits.store.settling`` retries it until then) — it stays pending meanwhile, and expires
after ``pending_ttl_ms`` if Redis does not answer before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ankusa_site.core import metrics
from ankusa_site.core.logs import log_event
from limits.store.base import Charge, Claim, Error, Result, Settle, Store
from limits.store.local import LocalStore
from limits.store.redis import RedisStore

logger = logging.getLogger("ankusa.limits.fleet")


class FleetStore(Store):
    def __init__(
        self,
        fleet: RedisStore,
        local: LocalStore,
        *,
        threshold: int,
        cooldown_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.fleet = fleet
        self.local = local
        self.threshold = threshold
        self.cooldown_ms = cooldown_ms
        self.clock = clock
        self.fallbacks = 0
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False

    @property
    def breaker_open(self) -> bool:
        return self._opened_at is not None

    def hit(self, charges: list[Charge], claim: Claim | None = None, timeout_ms: int | None = None) -> Result:
        if self._may_ask_fleet():
            result = self.fleet.hit(charges, claim, timeout_ms)
            if not isinstance(result, Error):
                self._answered()
                return result
            self._failed(result.reason)
        with self._lock:
            self.fallbacks += 1
        metrics.FLEET_FALLBACKS.inc()
        return self.local.hit(charges, claim)

    def settle(
        self, claim: Claim, committed: bool, timeout_ms: int | None = None, *, command_id: str | None = None
    ) -> bool | Error:
        if self.local.settle(claim, committed, command_id=command_id):
            return True
        if not self._may_ask_fleet():
            return Error("fleet store unavailable (circuit open)")
        result = self.fleet.settle(claim, committed, timeout_ms, command_id=command_id)
        if isinstance(result, Error):
            self._failed(result.reason)
        else:
            self._answered()
        return result

    @property
    def settles_after_answer(self) -> bool:
        return self.fleet.settles_after_answer

    def settle_many(self, settles: list[Settle], timeout_ms: int | None = None) -> list[bool | Error]:
        """As ``settle`` for each: the local store first, the others to Redis in one call."""
        answers: list[bool | Error] = [
            True if self.local.settle(one.claim, one.committed, command_id=one.command_id) else None
            for one in settles
        ]
        remote = [i for i, answer in enumerate(answers) if answer is None]
        if not remote:
            return answers
        if not self._may_ask_fleet():
            unavailable = Error("fleet store unavailable (circuit open)")
            return [unavailable if answer is None else answer for answer in answers]
        replies = self.fleet.settle_many([settles[i] for i in remote], timeout_ms)
        failed = next((reply for reply in replies if isinstance(reply, Error)), None)
        if failed is not None:
            self._failed(failed.reason)
        else:
            self._answered()
        for i, reply in zip(remote, replies, strict=True):
            answers[i] = reply
        return answers

    def hit_and_settle(
        self, charges: list[Charge], claim: Claim | None, settles: list[Settle], timeout_ms: int | None = None
    ) -> tuple[Result, list[bool | Error]]:
        """As ``hit`` and ``settle_many``: the settles held locally here, the others ride on the hit's
        round trip to Redis; when Redis does not answer, the hit is answered locally and those
        settles are ``Error`` (their caller tries them again)."""
        answers: list = [
            True if self.local.settle(one.claim, one.committed, command_id=one.command_id) else None
            for one in settles
        ]
        remote = [i for i, answer in enumerate(answers) if answer is None]
        if self._may_ask_fleet():
            result, replies = self.fleet.hit_and_settle(
                charges, claim, [settles[i] for i in remote], timeout_ms
            )
            for i, reply in zip(remote, replies, strict=True):
                answers[i] = reply
            if not isinstance(result, Error):
                self._answered()
                return result, answers
            self._failed(result.reason)
        else:
            result = Error("fleet store unavailable (circuit open)")
        for i in remote:
            if answers[i] is None or not isinstance(answers[i], bool):
                answers[i] = result
        with self._lock:
            self.fallbacks += 1
        metrics.FLEET_FALLBACKS.inc()
        return self.local.hit(charges, claim), answers

    def reset(self, tenant: str, timeout_ms: int | None = None) -> bool | Error:
        """Both stores: the local buckets were charged during any outage. Rare (a limit changed), so
        it asks Redis whatever the breaker says."""
        self.local.reset(tenant)
        return self.fleet.reset(tenant, timeout_ms)

    def stats(self) -> dict:
        with self._lock:
            return {
                "breaker": "open" if self._opened_at is not None else "closed",
                "consecutive_failures": self._failures,
                "fallbacks": self.fallbacks,
            }

    def _may_ask_fleet(self) -> bool:
        with self._lock:
            if self._opened_at is None:
                return True
            if self._probing or (self.clock() - self._opened_at) * 1000 < self.cooldown_ms:
                return False
            self._probing = True
            return True

    def _answered(self) -> None:
        with self._lock:
            self._failures = 0
            self._probing = False
            if self._opened_at is None:
                return
            self._opened_at = None
            fallbacks = self.fallbacks
        metrics.FLEET_BREAKER_OPEN.set(0)
        log_event(logger, "fleet_store_recovered", answered_locally_so_far=fallbacks)

    def _failed(self, reason: str) -> None:
        with self._lock:
            self._failures += 1
            was_probe, self._probing = self._probing, False
            if self._opened_at is not None or self._failures < self.threshold:
                if was_probe:
                    self._opened_at = self.clock()
                return
            self._opened_at = self.clock()
        metrics.FLEET_BREAKER_OPEN.set(1)
        log_event(
            logger,
            "fleet_store_failing",
            level=logging.WARNING,
            reason=reason,
            probe_every_ms=self.cooldown_ms,
        )
