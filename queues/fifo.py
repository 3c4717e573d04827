"""The reliable FIFO: the hand-off between intake and dispatch (seed: ``ReliableFIFO.pm``).

A queue has three sub-queues: ``main`` (waiting, strict FIFO), ``busy`` (claimed by a consumer,
with the claim time) and ``failed`` (given up on, with the last error, in the order they failed).
A consumer claims items, works on them and marks them done; a consumer that dies leaves its items
in ``busy`` until ``handle_expired`` recovers them (``manage.py queues recover`` or the dispatch
loop, after ``ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S``).

Identity is the item id, never the payload: two identical payloads are two items. Each claim of
an item increments its ``claims`` number, and ``done``/``requeue``/``fail``/``unclaim`` given an
``Item`` act only while the item is still busy *under that claim*. So a consumer whose claim
expired and whose item was recovered and claimed by someone else cannot complete or requeue it a
second time: the call skips it, logs a warning and reports it in its return value. (A bare id
instead of an ``Item`` skips that guard: it acts on whatever claim the item is under.)

The backend of a queue name: ``queues.backends.get_queue``. Both backends keep the seed's bounds:
enqueue O(1) per item, claim O(n claimed) whatever the queue length, done O(log busy).

What this does NOT guarantee:
* Exactly-once *processing*. An item is handed to one consumer at a time, but a consumer that
  dies after its work and before ``done`` leaves it busy, and recovery hands it out again: this is
  at-least-once delivery, and ``commands`` decides whether a second send is safe.
* FIFO across consumers. Claims are in strict order; two consumers working at different speeds
  finish in any order. Items enqueued by concurrent transactions are ordered by commit, roughly.
* Clock agreement. Claim and failure times come from the clock of the node that made them
  (``clock``, default ``django.utils.timezone.now``); recovery compares them with its own. Skew of
  seconds between nodes is noise against a visibility timeout of minutes.
"""

from __future__ import annotations

import abc
import functools
import json
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone

from ankusa_site.core import metrics
from ankusa_site.core.logs import log_event

Kind = Literal["main", "busy", "failed"]
KINDS: tuple[Kind, ...] = ("main", "busy", "failed")
Action = Literal["requeue", "fail", "drop"]
ACTIONS: tuple[Action, ...] = ("requeue", "fail", "drop")

# Queue names end up inside Redis keys (between the braces of a hash tag) and in URLs.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# The error text kept on an item; the rest is cut (an HTML error page is not worth 1 MB per row).
MAX_ERROR_CHARS = 2000
# ``claim(wait=...)`` polls an empty queue, doubling its pause from the first to the last value:
# an item that arrives while a consumer waits is picked up within 200 ms, and an idle consumer
# costs its backend five cheap queries a second.
POLL_FIRST_S = 0.01
POLL_MAX_S = 0.2

logger = logging.getLogger("ankusa.queues")


@dataclass(frozen=True)
class Item:
    """One queued payload and its history. ``claims`` is also the token of the current claim."""

    id: int
    payload: Any
    enqueued_at: datetime
    claimed_at: datetime | None = None
    requeue_count: int = 0
    fail_count: int = 0
    last_error: str = ""
    claims: int = 0
    failed_at: datetime | None = None

    def since(self, kind: Kind) -> datetime | None:
        """When the item entered sub-queue ``kind``: main when enqueued, busy when claimed, failed
        when it failed (None when that never happened)."""
        return {"main": self.enqueued_at, "busy": self.claimed_at, "failed": self.failed_at}[kind]


class ReliableFIFO(abc.ABC):
    """The interface every backend implements; ``claim`` and ``consume`` are shared here."""

    backend: str = ""

    def __init__(
        self,
        name: str,
        *,
        requeue_limit: int = 5,
        visibility_timeout: timedelta = timedelta(minutes=5),
        clock: Callable[[], datetime] = timezone.now,
    ):
        if not NAME_PATTERN.match(name):
            raise ValueError(f"Queue name {name!r}: use 1 to 64 letters, digits, '_', '.' or '-'.")
        self.name = name
        self.requeue_limit = requeue_limit
        self.visibility_timeout = visibility_timeout
        self.clock = clock

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    # --- producers --------------------------------------------------------------------------------

    @abc.abstractmethod
    def enqueue(self, *payloads: Any) -> list[int]:
        """Append JSON payloads in order; returns their item ids. O(1) per item."""

    # --- transactional writes: what every backend declares -----------------------------------------

    @abc.abstractmethod
    def joins_transaction(self, using: str = DEFAULT_DB_ALIAS) -> bool:
        """Whether this queue's writes join the caller's transaction on database connection
        ``using`` (they commit or roll back with it), or cannot (written after the commit)."""

    def on_commit(self, write: Callable[[], object], *, using: str = DEFAULT_DB_ALIAS) -> None:
        """Run ``write`` (a call on this queue) as part of the caller's transaction on ``using``.

        A queue that joins it (``joins_transaction``) writes now, inside it: the write commits or
        rolls back with the caller's rows, atomically. Any other writes after the commit
        (``transaction.on_commit``): a rollback leaves nothing written, but a crash or an outage
        between the commit and the write leaves the caller's rows without it, so the caller must be
        able to find and redo them (commands: the dispatch loop's recovery of lost commands).
        Outside a transaction both write at once.
        """
        if self.joins_transaction(using):
            write()
        else:
            transaction.on_commit(write, using=using)

    def enqueue_on_commit(self, *payloads: Any, using: str = DEFAULT_DB_ALIAS) -> None:
        """``enqueue`` as part of the caller's transaction on ``using`` (see ``on_commit``): the
        items exist once it commits, and never if it rolls back."""
        if payloads:
            self.on_commit(functools.partial(self.enqueue, *payloads), using=using)

    def enqueue_in_statement(
        self, rows: str, payload: str, order: str, *, using: str = DEFAULT_DB_ALIAS
    ) -> tuple[str, list] | None:
        """An SQL ``INSERT`` of items for the caller's own statement on ``using``, or None when this
        queue cannot be written by it (the default: another store, another connection, a vendor or
        a mode without the hand-written SQL). One item per row of ``rows`` (a table expression of
        the caller's statement, e.g. a data-modifying CTE), in the order of ``order``, ``payload``
        an SQL expression of its JSON. Returns the SQL and its parameters, placed first. A caller
        given None writes its rows, then ``enqueue_on_commit``: the same items, more round trips.
        """
        return None

    # --- consumers --------------------------------------------------------------------------------

    def claim(self, n: int = 1, wait: float = 0) -> list[Item]:
        """Move the ``n`` oldest items to busy and return them in order (fewer when fewer are ready).

        When the queue is empty, polls it for up to ``wait`` seconds. O(n), whatever the length.
        """
        if n < 1:
            raise ValueError("claim needs n >= 1.")
        deadline = time.monotonic() + wait
        pause = POLL_FIRST_S
        while True:
            items = self._claim(n, self.clock())
            left = deadline - time.monotonic()
            if items or left <= 0:
                return items
            time.sleep(min(pause, left))
            pause = min(pause * 2, POLL_MAX_S)

    @abc.abstractmethod
    def _claim(self, n: int, now: datetime) -> list[Item]:
        """One attempt at claiming ``n`` items at ``now``, in queue order."""

    @abc.abstractmethod
    def done(self, *items: Item | int) -> int:
        """Finish busy items; returns how many were finished. An item no longer held is skipped."""

    def done_in_statement(
        self, *items: Item, using: str = DEFAULT_DB_ALIAS
    ) -> tuple[str, list, Callable[[list[int]], int]] | None:
        """``done(*items)`` for the caller's own statement on ``using``, or None when this queue
        cannot be written by it (the default; see ``enqueue_in_statement``). Returns a
        data-modifying SQL statement for the caller's ``WITH`` whose ``RETURNING`` gives the ids of
        the items it finished, its parameters, and what to call with those ids once the statement
        has run (it returns how many were finished, as ``done``)."""
        return None

    def done_and_claim(self, *items: Item | int, n: int = 1, wait: float = 0) -> list[Item]:
        """``done(*items)`` then ``claim(n, wait)``; a backend may do both in one round trip."""
        self.done(*items)
        return self.claim(n, wait)

    def fail(self, item: Item | int, error: str) -> bool:
        """Move a busy item to failed with ``error``; False when it was no longer held."""
        return self._release("fail", [item], error=error) == 1

    def requeue(self, *items: Item | int, front: bool = False, error: str = "") -> int:
        """Put busy items back at the tail (or the head), counting towards ``requeue_limit``.

        An item already requeued ``requeue_limit`` times goes to failed instead, keeping ``error``.
        Returns how many items were still held (and so moved, to main or to failed).
        """
        return self._release("requeue", items, error=error, front=front)

    def unclaim(self, *items: Item | int) -> int:
        """Put busy items back at the head in the given order, uncounted (work not started)."""
        return self._release("unclaim", items, front=True)

    @abc.abstractmethod
    def _release(
        self, mode: str, items: Iterable[Item | int], *, error: str = "", front: bool = False
    ) -> int:
        """Move the items still held out of busy: ``fail``, ``requeue`` (to failed past the limit)
        or ``unclaim``, at the head when ``front``; returns how many were held."""

    # --- waking consumers (queues.wake) -------------------------------------------------------------

    def wake(self) -> None:
        """Wake the consumers waiting on this queue (``wait_for_work``), as a commit that enqueues
        does: inside a transaction of the database backend, on its commit. Nothing where the
        backend cannot wake (SQLite: consumers poll)."""
        return None  # the default: nothing to wake, waiters poll

    def wait_for_work(self, timeout: float) -> bool:
        """Block until a wake for this queue arrives (True: work may be waiting) or ``timeout``
        seconds pass (False). A timeout of 0 is a look: whether a wake arrived since the last
        wait, without waiting (and, on PostgreSQL, False while this process listens to nothing).
        Only a wait makes the caller a sleeper that commits must wake (``queues.wake``): a
        consumer busy between claims looks for new work by claiming, not by looking.
        Where the backend cannot wake, sleeps out the timeout: the caller's poll is the safety
        net either way."""
        if timeout > 0:
            time.sleep(timeout)
        return False

    # --- recovery and the failed list ---------------------------------------------------------------

    def handle_expired(
        self, older_than: timedelta | None = None, action: Action = "requeue", *, limit: int | None = None
    ) -> list[Item]:
        """Recover items claimed longer ago than ``older_than`` (default: the visibility timeout).

        ``requeue`` counts towards the requeue limit like ``requeue``; ``fail`` moves them to failed;
        ``drop`` deletes them. Returns the items touched, as they were while busy, oldest claim
        first; at most ``limit`` of them. Never scans the whole busy set. Counted in
        ``ankusa_queue_recovered_total{queue,action}``.
        """
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}.")
        touched = self._handle_expired(older_than, action, limit=limit)
        if touched:
            metrics.QUEUE_RECOVERED.labels(queue=self.name, action=action).inc(len(touched))
        return touched

    @abc.abstractmethod
    def _handle_expired(
        self, older_than: timedelta | None, action: Action, *, limit: int | None
    ) -> list[Item]:
        """The backend's recovery, ``action`` already checked (see ``handle_expired``)."""

    @abc.abstractmethod
    def requeue_failed(
        self, max_fail_count: int | None = None, delay: timedelta | None = None, *, limit: int | None = None
    ) -> int:
        """Move failed items back to the tail of main, in the order they failed, with a fresh
        requeue count. Only those that failed at most ``max_fail_count`` times and at least
        ``delay`` ago. Returns how many moved. O(failed): an operator's action, not a hot path.
        """

    @abc.abstractmethod
    def remove_failed(self, older_than: timedelta | None = None, *, limit: int | None = None) -> int:
        """Delete failed items that failed at least ``older_than`` ago (all, without it)."""

    # --- operator actions on chosen items (the admin's requeue / drop) -------------------------------

    @abc.abstractmethod
    def requeue_ids(self, ids: Iterable[int]) -> int:
        """Put the chosen busy or failed items at the tail of main with a fresh requeue count, in
        one atomic step; returns how many moved.

        A person's decision, so it ignores claims (a worker holding a busy item loses it: its
        ``done`` becomes a no-op) and the requeue limit. Items already waiting stay where they are;
        unknown ids are ignored. The order among the moved items is the backend's (the database:
        their last place in main; Redis: their ids, that is the order they were first enqueued).
        """

    @abc.abstractmethod
    def drop_ids(self, ids: Iterable[int]) -> int:
        """Delete the chosen items whatever their sub-queue, in one atomic step; returns how many.
        A worker holding a dropped busy item finds its ``done`` a no-op; unknown ids are ignored."""

    # --- inspection ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def length(self, kind: Kind = "main") -> int:
        """How many items are in the sub-queue."""

    @abc.abstractmethod
    def peek(self, kind: Kind = "main", n: int = 1) -> list[Item]:
        """The first ``n`` items of a sub-queue without claiming them: main in claim order, busy by
        claim time, failed in the order they failed."""

    def age(self, kind: Kind = "main") -> timedelta | None:
        """How long the first item of a sub-queue has waited: main since it was enqueued (the head
        item), busy since it was claimed (the oldest claim), failed since it failed (the oldest
        failure). None when the sub-queue is empty."""
        head = self.peek(kind, 1)
        if not head:
            return None
        since = head[0].since(kind)
        return max(self.clock() - since, timedelta(0)) if since else None

    def stats(self) -> dict[str, Any]:
        """Lengths and ages of the three sub-queues (what the admin page, API and command show)."""
        result: dict[str, Any] = {"name": self.name, "backend": self.backend}
        for kind in KINDS:
            age = self.age(kind)
            result[kind] = {
                "length": self.length(kind),
                "age_s": None if age is None else age.total_seconds(),
            }
        return result

    @abc.abstractmethod
    def flush(self) -> int:
        """Delete every item of the queue, whatever its sub-queue; returns how many. O(n)."""

    # --- the consumer loop --------------------------------------------------------------------------

    def consume(
        self,
        callback: Callable[[Item], Any],
        *,
        on_error: Action = "requeue",
        chunk: int = 1,
        max_items: int | None = None,
        max_seconds: float | None = None,
        return_when_empty: bool = False,
    ) -> int:
        """Claim ``chunk`` items at a time, call ``callback`` on each and mark it done (the items
        of a chunk are marked done together with the next claim, in one round trip on Redis).

        When the callback raises, the item is requeued (counted), failed or dropped as ``on_error``
        says, with the exception as its error. Returns how many items the callback handled
        (successfully or not). Stops after ``max_items`` items or ``max_seconds``, when the queue
        is empty if ``return_when_empty``, and on SIGTERM/SIGINT: the item in hand is finished,
        the rest of the chunk is unclaimed (back to the head, uncounted). The signal handlers are
        installed only when called from the main thread, and restored on return.
        """
        if on_error not in ACTIONS:
            raise ValueError(f"on_error must be one of {ACTIONS}.")
        stop = threading.Event()
        previous = _install_stop_handlers(stop)
        started = time.monotonic()
        handled = 0
        finished: list[Item] = []  # handled, marked done together with the next claim
        try:
            while not stop.is_set():
                budget = None if max_seconds is None else max_seconds - (time.monotonic() - started)
                wanted = chunk if max_items is None else min(chunk, max_items - handled)
                if wanted <= 0 or (budget is not None and budget <= 0):
                    break
                # Wait in short slices so a signal or the time budget is noticed promptly.
                wait = 0 if return_when_empty else min(1.0, budget if budget is not None else 1.0)
                items = self.done_and_claim(*finished, n=wanted, wait=wait)
                finished = []
                if not items and return_when_empty:
                    break
                for index, item in enumerate(items):
                    if stop.is_set():
                        self.unclaim(*items[index:])
                        break
                    if self._handle(item, callback, on_error):
                        finished.append(item)
                    handled += 1
        finally:
            if finished:
                self.done(*finished)
            _restore_handlers(previous)
        return handled

    def _handle(self, item: Item, callback: Callable[[Item], Any], on_error: Action) -> bool:
        """Run the callback; True when it succeeded (the item is then the caller's to mark done)."""
        try:
            callback(item)
        except Exception as exc:  # noqa: BLE001 - a failing item must not stop the consumer
            error = f"{type(exc).__name__}: {exc}"
            log_event(
                logger, "queue_item_failed", level=logging.WARNING, queue=self.name, item=item.id, error=error
            )
            if on_error == "requeue":
                self.requeue(item, error=error)
            elif on_error == "fail":
                self.fail(item, error)
            else:
                self.done(item)
            return False
        return True

    # --- helpers for the backends -------------------------------------------------------------------

    def _report_skipped(self, operation: str, wanted: Sequence[int], held: Sequence[int]) -> None:
        if len(held) == len(wanted):
            return  # the usual case, decided without building sets
        skipped = sorted(set(wanted) - set(held))
        if skipped:
            # Someone else holds these items now (their claim expired and recovery handed them
            # out again), or they were finished already: this call did nothing to them.
            log_event(
                logger,
                "queue_claim_lost",
                level=logging.WARNING,
                queue=self.name,
                operation=operation,
                skipped=len(skipped),
                ids=skipped[:20],
            )


# What JSON carries but not every backend stores: a lone surrogate (UTF-8 cannot encode it, so
# neither Redis nor PostgreSQL takes it) and NUL (PostgreSQL's jsonb refuses the escape). In the
# encoded text a NUL is the escape \u0000 after an even run of backslashes (an odd one escapes the
# backslash instead); a lone surrogate stays itself.
_UNSTORABLE = re.compile(r"[\ud800-\udfff]|(?<!\\)(?:\\\\)*\\u0000")


def encode_payload(payload: Any) -> str:
    """The payload as compact JSON; anything JSON cannot carry (NaN, sets, objects) is refused, and
    what some backend could not store (NUL, a lone surrogate), so every backend takes the same."""
    try:
        text = json.dumps(payload, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"A queue payload must be JSON: {exc}") from None
    if _UNSTORABLE.search(text):
        raise ValueError("A queue payload must be JSON every backend can store: no NUL, no lone surrogate.")
    return text


def clip_error(error: str) -> str:
    return str(error)[:MAX_ERROR_CHARS]


def ids_of(items: Iterable[Item | int]) -> list[int]:
    return [item.id if isinstance(item, Item) else int(item) for item in items]


def _install_stop_handlers(stop: threading.Event) -> dict[int, Any]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum, frame):
        log_event(logger, "queue_consumer_stopping", signal=signal.Signals(signum).name)
        stop.set()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
