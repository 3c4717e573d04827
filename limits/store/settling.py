"""Settles that missed the store's budget, retried off the request path until they land.

A settle that times out (Redis slow or gone, or the fleet store's breaker open) leaves its claim
pending: a provider's retry of a committed event is answered 409 ``in_flight`` instead of 200
duplicate, and a released key stays blocked, each for the rest of the claim's pending TTL.
``limits.admission.settle`` hands such a settle to this process's ``SettleRetrier``, whose one
thread tries it again with a budget of ``BUDGET_MS`` (larger than a request's: nobody waits on
it), until the store answers — True, settled; False, no longer held by this token (expired or
taken over): nothing is left to do either way — or until the claim's pending TTL has passed
since it was handed over, when the claim has expired by itself and a commit cannot land any more.

Settles are tried in the order they came; one that fails goes to the back. A failure pauses them
all for a backoff that starts at ``FIRST_DELAY_S`` and doubles up to ``MAX_DELAY_S`` (the next
failure will likely be the same outage; each try against a frozen Redis costs its whole budget),
and an answer resets it.

Bounded: at most ``capacity`` settles wait (a claim is a few hundred bytes); one more is dropped and
logged, and its claim expires by itself, as it did before this existed. Thread-safe: any thread
adds, one thread works; it starts with the first settle of each process (a forked worker starts
its own). It survives an outage: a store answers failure as a value, and anything one raises is
logged and treated as a failure.

Not guaranteed: a settle still waiting when its process exits is lost (its claim then expires
after the pending TTL, as without the retrier).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ankusa_site.logs import log_event
from limits.store.base import Claim, Error, Store

logger = logging.getLogger("ankusa.limits")

# Off the request path a settle may wait longer than a request's 50 ms: long enough for a busy
# Redis, short enough that a frozen one holds the queue for a fraction of a second per try.
BUDGET_MS = 250
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0
CAPACITY = 10_000


@dataclass(frozen=True)
class _Settle:
    store: Store
    claim: Claim
    committed: bool
    command_id: str | None
    give_up_at: float
    added_at: float


class SettleRetrier:
    """See the module docstring. ``background=False`` starts no thread: the caller runs
    ``run_once()`` itself (tests, with an injected ``clock``)."""

    def __init__(
        self,
        *,
        capacity: int = CAPACITY,
        budget_ms: int = BUDGET_MS,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ):
        self.capacity = capacity
        self.budget_ms = budget_ms
        self.clock = clock
        self.background = background
        self.forget()

    def forget(self) -> None:
        """Start afresh: nothing waiting, no thread (a forked child's state, since its parent's
        thread did not come along)."""
        self._turn = threading.Condition()
        self._waiting: collections.deque[_Settle] = collections.deque()
        self._delay = 0.0
        self._resume_at = 0.0
        self._started = False

    def add(self, store: Store, claim: Claim, committed: bool, command_id: str | None, reason: str) -> bool:
        """Retry this settle until it lands; False when ``capacity`` settles wait already."""
        now = self.clock()
        with self._turn:
            full = len(self._waiting) >= self.capacity
            if not full:
                give_up_at = now + claim.pending_ttl_ms / 1000
                self._waiting.append(_Settle(store, claim, committed, command_id, give_up_at, now))
                if self.background and not self._started:
                    self._started = True
                    threading.Thread(target=self._work, name="claim-settles", daemon=True).start()
                self._turn.notify()
        _log(
            "claim_settle_dropped" if full else "claim_settle_retrying",
            logging.WARNING,
            claim,
            committed,
            reason=reason,
        )
        return not full

    def pending(self) -> int:
        with self._turn:
            return len(self._waiting)

    def run_once(self) -> bool:
        """Give up the settles whose claims have expired, then try the others in order until one
        fails; whether none is left waiting."""
        self._give_up_expired(self.clock())
        while True:
            with self._turn:
                if not self._waiting:
                    return True
                settle = self._waiting[0]  # only this thread takes from the left
            if self.clock() >= settle.give_up_at:
                self._done(answered=False)
                _log("claim_settle_given_up", logging.WARNING, settle.claim, settle.committed)
                continue
            try:
                answer = settle.store.settle(
                    settle.claim, settle.committed, self.budget_ms, command_id=settle.command_id
                )
            except Exception as exc:  # a store should not raise; if one does, this thread lives on
                answer = Error(f"{type(exc).__name__}: {exc}"[:200])
            if isinstance(answer, Error):
                with self._turn:
                    self._waiting.rotate(-1)  # to the back: one dead store holds up no other
                    self._delay = min(max(2 * self._delay, FIRST_DELAY_S), MAX_DELAY_S)
                    self._resume_at = self.clock() + self._delay
                return False
            self._done(answered=True)
            _log(
                "claim_settle_landed" if answer else "claim_settle_moot",
                logging.INFO,
                settle.claim,
                settle.committed,
                after_ms=round((self.clock() - settle.added_at) * 1000),
            )

    def _give_up_expired(self, now: float) -> None:
        """Drop every settle whose claim has expired (during an outage only the first in line is
        tried each round; the others must not wait out their claims in a full retrier)."""
        with self._turn:
            expired = [settle for settle in self._waiting if now >= settle.give_up_at]
            if expired:
                self._waiting = collections.deque(s for s in self._waiting if now < s.give_up_at)
        for settle in expired:
            _log("claim_settle_given_up", logging.WARNING, settle.claim, settle.committed)

    def _done(self, *, answered: bool) -> None:
        with self._turn:
            self._waiting.popleft()
            if answered:  # the store answers again: no more backoff
                self._delay = 0.0

    def _work(self) -> None:
        while True:
            try:
                self.run_once()
            except Exception:  # a log handler's failure, say: the thread must outlive it
                logger.exception("claim_settle_retrier_failed")
                with self._turn:
                    self._resume_at = self.clock() + MAX_DELAY_S
            with self._turn:
                while True:
                    now = self.clock()
                    if self._waiting and now >= self._resume_at:
                        break
                    self._turn.wait(self._resume_at - now if self._waiting else None)


def _log(event: str, level: int, claim: Claim, committed: bool, **fields) -> None:
    log_event(
        logger,
        event,
        level=level,
        action="commit" if committed else "release",
        tenant=claim.tenant,
        source=claim.source_id,
        event_key=claim.key[:200],
        **fields,
    )


RETRIER = SettleRetrier()
os.register_at_fork(after_in_child=RETRIER.forget)
