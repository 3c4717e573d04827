"""Settles off the request path: this process's one thread that lands them, batched, retried.

Two kinds of settle come here, and go the same way:

* **after the answer** — with a store whose settle costs a round trip (``settles_after_answer``:
  the fleet store), the intake answers 202 once the hook is committed and hands the claim's
  commit here (``limits.admission.settle_after_answer``) instead of waiting on Redis. The claim
  stays *pending* until it lands (seed ``Ankusa.RateLimiter.Store``: pending until durable — it is
  durable already, so only the order of the answer and the settle changed): a duplicate in that
  window is answered 409 ``in_flight`` and its retry 200, never a 2xx for a hook nobody stored;
* **missed the budget** — a settle made on the request path that timed out (Redis slow or gone,
  or the fleet store's breaker open), which would otherwise leave its claim pending: a committed
  event's retries answered 409 instead of 200, and a released key blocked, each for the rest of
  the claim's pending TTL.

A settle made after the answer first waits up to ``LINGER_S`` for the process's next request to
carry it: ``limits.admission.admit`` takes what waits (``take``) and sends it in front of its own
claim, in the same write (``Store.hit_and_settle``: one round trip for both, and no wake-up of
this thread). What no request carried, and every retry, the thread takes in the order it came, up
to ``BATCH`` at a time, and settles in one call (``Store.settle_many``: one pipelined round trip),
with a budget of ``BUDGET_MS`` (larger than a request's: nobody waits on it). Each answer ends its
settle — True, settled; False, no longer held by this token (expired or taken over): nothing is
left to do either way. An ``Error`` sends it to the back, to be tried again until the claim's
pending TTL has passed since it was handed over, when the claim has expired by itself and a commit
cannot land any more (the database's unique constraint still refuses a second copy: a duplicate
is then answered 200 from the stored row). A failure pauses them all for a backoff that starts at
``FIRST_DELAY_S`` and doubles up to ``MAX_DELAY_S`` (the next failure will likely be the same
outage; each try against a frozen Redis costs its whole budget), and an answer resets it.

Bounded: at most ``capacity`` settles wait (a claim is a few hundred bytes); one more is dropped and
logged, and its claim expires by itself. Thread-safe: any thread adds or carries, one thread works; it starts
with the first settle of each process (a forked worker starts its own). It survives an outage: a
store answers failure as a value, and anything one raises is logged and treated as a failure. At
the process's normal exit what waits gets one last try (``flush``).

Not guaranteed: a settle still waiting when its process dies is lost (its claim then stays
pending, and duplicates are answered 409, until the pending TTL ends; then the database's unique
constraint answers them as duplicates).
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ankusa_site.core.logs import log_event
from limits.store.base import Claim, Error, Settle, Store

logger = logging.getLogger("ankusa.limits")

# Off the request path a settle may wait longer than a request's 50 ms: long enough for a busy
# Redis, short enough that a frozen one holds the queue for a fraction of a second per try.
BUDGET_MS = 250
FIRST_DELAY_S = 0.05
MAX_DELAY_S = 1.0
CAPACITY = 10_000
# Settles per round trip: enough that a busy process's settles of one moment go together, few
# enough that one call's reply stays small (a settle's reply is an integer).
BATCH = 256
# How long a settle made after the answer waits for the process's next request to carry it in its
# own round trip to Redis (its claim's), before this thread sends it alone: under load the next
# request comes sooner, and the settle costs no round trip and no wake-up of this thread; idle, a
# duplicate meets the pending claim (409) for this much longer.
LINGER_S = 0.005
# How long the thread keeps looking every LINGER_S after the queue emptied, before it sleeps until
# the next settle wakes it.
IDLE_S = 1.0


@dataclass(frozen=True)
class _Settle:
    store: Store
    claim: Claim
    committed: bool
    command_id: str | None
    give_up_at: float
    added_at: float
    retried: bool  # handed over after a miss (logged as it lands), not after the answer

    def request(self) -> Settle:
        return Settle(self.claim, self.committed, self.command_id)


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
        linger_s: float = LINGER_S,
    ):
        self.capacity = capacity
        self.budget_ms = budget_ms
        self.clock = clock
        self.background = background
        self.linger_s = linger_s
        self.forget()

    def forget(self) -> None:
        """Start afresh: nothing waiting, no thread (a forked child's state, since its parent's
        thread did not come along)."""
        self._turn = threading.Condition()
        self._waiting: collections.deque[_Settle] = collections.deque()
        self._in_flight = 0
        self._asleep = True  # the thread waits for a notify (it has been idle for IDLE_S)
        self._delay = 0.0
        self._resume_at = 0.0
        self._started = False

    def add(
        self, store: Store, claim: Claim, committed: bool, command_id: str | None, reason: str | None = None
    ) -> bool:
        """Settle this claim off the request path, until it lands; False when ``capacity`` settles
        wait already. ``reason``: why a settle made on the request path missed (logged); None for
        a settle after the answer."""
        now = self.clock()
        with self._turn:
            full = len(self._waiting) >= self.capacity
            if not full:
                give_up_at = now + claim.pending_ttl_ms / 1000
                self._waiting.append(
                    _Settle(store, claim, committed, command_id, give_up_at, now, reason is not None)
                )
                if self.background and not self._started:
                    self._started = True
                    threading.Thread(target=self._work, name="claim-settles", daemon=True).start()
                if self._asleep:  # otherwise the thread looks again within LINGER_S by itself
                    self._turn.notify()
        if full or reason is not None:
            _log(
                "claim_settle_dropped" if full else "claim_settle_retrying",
                logging.WARNING,
                claim,
                committed,
                reason=reason or "after the answer",
            )
        return not full

    def pending(self) -> int:
        """Settles not landed yet: waiting, or on their way in someone's round trip."""
        with self._turn:
            return len(self._waiting) + self._in_flight

    def take(self, store: Store, limit: int = BATCH) -> list[_Settle]:
        """The first settles in line, up to ``limit``, that ``store`` settles: for a caller that
        carries them in a round trip of its own (``limits.admission.admit``: on a request's hit),
        which must hand them back with their answers (``returned``)."""
        with self._turn:
            taken = []
            while self._waiting and len(taken) < limit and self._waiting[0].store is store:
                taken.append(self._waiting.popleft())
            self._in_flight += len(taken)
        return taken

    def returned(self, taken: list[_Settle], answers: list) -> bool:
        """The answers to settles ``take`` gave out, in order: those that failed go to the back of
        the line (and pause the thread for the backoff); whether all of them landed."""
        failed = [one for one, answer in zip(taken, answers, strict=True) if isinstance(answer, Error)]
        with self._turn:
            self._in_flight -= len(taken)
            self._waiting.extend(failed)  # to the back: one dead store holds up no other
            if failed:
                self._delay = min(max(2 * self._delay, FIRST_DELAY_S), MAX_DELAY_S)
                self._resume_at = self.clock() + self._delay
                if self._asleep:
                    self._turn.notify()
            else:  # the store answers again: no more backoff
                self._delay = 0.0
        for one, answer in zip(taken, answers, strict=True):
            if one.retried and not isinstance(answer, Error):
                _log(
                    "claim_settle_landed" if answer else "claim_settle_moot",
                    logging.INFO,
                    one.claim,
                    one.committed,
                    after_ms=round((self.clock() - one.added_at) * 1000),
                )
            elif answer is False:  # after the answer: the claim expired before it landed
                _log("claim_settle_moot", logging.WARNING, one.claim, one.committed)
        return not failed

    def run_once(self) -> bool:
        """Give up the settles whose claims have expired, then settle the others, a batch (of one
        store) per call, in order, until a call fails; whether none is left waiting."""
        self._give_up_expired(self.clock())
        while True:
            with self._turn:
                if not self._waiting:
                    return True
                store = self._waiting[0].store
            batch = self.take(store)
            if not batch:  # a request took them meanwhile
                continue
            try:
                answers = store.settle_many([one.request() for one in batch], self.budget_ms)
            except Exception as exc:  # a store should not raise; if one does, this thread lives on
                answers = [Error(f"{type(exc).__name__}: {exc}"[:200])] * len(batch)
            if not self.returned(batch, answers):
                return False

    def flush(self, timeout_s: float = 1.0) -> bool:
        """What waits now, tried for up to ``timeout_s`` (a process's normal exit); whether none is
        left. With the thread running it waits for the thread, which does the work."""
        with self._turn:
            started = self._started
        if not started:
            return self.run_once()
        deadline = time.monotonic() + timeout_s
        with self._turn:
            self._resume_at = 0.0
            self._turn.notify()
            while (self._waiting or self._in_flight) and time.monotonic() < deadline:
                self._turn.wait(0.01)
            return not (self._waiting or self._in_flight)

    def _give_up_expired(self, now: float) -> None:
        """Drop every settle whose claim has expired (during an outage only the first in line is
        tried each round; the others must not wait out their claims in a full retrier)."""
        with self._turn:
            expired = [settle for settle in self._waiting if now >= settle.give_up_at]
            if expired:
                self._waiting = collections.deque(s for s in self._waiting if now < s.give_up_at)
        for settle in expired:
            _log("claim_settle_given_up", logging.WARNING, settle.claim, settle.committed)

    def _work(self) -> None:
        while True:
            try:
                self.run_once()
            except Exception:  # a log handler's failure, say: the thread must outlive it
                logger.exception("claim_settle_retrier_failed")
                with self._turn:
                    self._resume_at = self.clock() + MAX_DELAY_S
            with self._turn:
                idle_since = None
                while True:
                    now = self.clock()
                    if not self._waiting:
                        # Busy, requests carry the settles and the queue empties and fills again
                        # all the time: look every LINGER_S rather than be woken by each one.
                        # Idle for IDLE_S: sleep until a settle comes.
                        idle_since = now if idle_since is None else idle_since
                        self._asleep = now - idle_since >= IDLE_S
                        self._turn.wait(None if self._asleep else self.linger_s)
                        continue
                    self._asleep, idle_since = False, None
                    first = self._waiting[0]
                    # A settle after the answer lingers a moment for a request to carry it.
                    due = max(self._resume_at, first.added_at + (0 if first.retried else self.linger_s))
                    if now >= due:
                        break
                    self._turn.wait(due - now)


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
atexit.register(RETRIER.flush)
