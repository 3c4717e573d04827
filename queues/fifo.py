"""The reliable FIFO: the hand-off between intake and dispatch (seed: ``ReliableFIFO.pm``).

A queue has three sub-queues: ``main`` (waiting, strict FIFO by enqueue order), ``busy``
(claimed by a consumer, with the claim time) and ``failed`` (given up on, with the last error).
A consumer claims items, works on them and marks them done; a consumer that dies leaves its items
in ``busy`` until ``handle_expired`` recovers them.

Identity is the item id, never the payload: two identical payloads are two items.

This module is the contract only. The backends (``queues.backends.database``,
``queues.backends.redis``) implement it and one contract test suite runs against each;
``get_queue(name)`` picks the backend the settings name for that queue.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

Kind = Literal["main", "busy", "failed"]


@dataclass(frozen=True)
class Item:
    id: int
    payload: Any
    enqueued_at: datetime
    claimed_at: datetime | None = None
    requeue_count: int = 0
    fail_count: int = 0
    last_error: str = ""


class ReliableFIFO(abc.ABC):
    """The interface every backend implements. Complexity bounds are the seed's."""

    def __init__(self, name: str, *, requeue_limit: int = 5):
        self.name = name
        self.requeue_limit = requeue_limit

    @abc.abstractmethod
    def enqueue(self, *payloads: Any) -> list[int]:
        """Append JSON payloads in order; returns their item ids. O(1) per item."""

    @abc.abstractmethod
    def claim(self, n: int = 1, wait: float = 0) -> list[Item]:
        """Move the ``n`` oldest items to busy and return them (fewer when fewer are ready).

        Blocks up to ``wait`` seconds when the queue is empty. O(n), independent of queue length.
        """

    @abc.abstractmethod
    def done(self, *items: Item | int) -> int:
        """Finish busy items; returns how many were finished. An item no longer busy is skipped."""

    @abc.abstractmethod
    def fail(self, item: Item | int, error: str) -> bool:
        """Move a busy item to failed with ``error``."""

    @abc.abstractmethod
    def requeue(self, *items: Item | int, front: bool = False, error: str = "") -> int:
        """Put busy items back (counted; past ``requeue_limit`` they go to failed)."""

    @abc.abstractmethod
    def unclaim(self, *items: Item | int) -> int:
        """Put busy items back at the head, uncounted (a consumer that will not work on them)."""

    @abc.abstractmethod
    def requeue_failed(self, max_fail_count: int | None = None, delay: timedelta | None = None) -> int:
        """Move failed items back to main."""

    @abc.abstractmethod
    def remove_failed(self, older_than: timedelta | None = None) -> int:
        """Drop failed items."""

    @abc.abstractmethod
    def handle_expired(
        self, older_than: timedelta, action: Literal["requeue", "fail", "drop"] = "requeue"
    ) -> list[Item]:
        """Recover items claimed longer ago than ``older_than``; returns what it touched."""

    @abc.abstractmethod
    def length(self, kind: Kind = "main") -> int: ...

    @abc.abstractmethod
    def peek(self, kind: Kind = "main", n: int = 1) -> list[Item]: ...

    @abc.abstractmethod
    def age(self, kind: Kind = "main") -> timedelta | None:
        """Age of the oldest item of ``kind`` (by enqueue time for main/failed, claim time for busy)."""

    @abc.abstractmethod
    def flush(self) -> int: ...

    @abc.abstractmethod
    def consume(
        self,
        callback: Callable[[Item], Any],
        *,
        on_error: Literal["requeue", "fail", "drop"] = "requeue",
        chunk: int = 1,
        max_items: int | None = None,
        max_seconds: float | None = None,
        return_when_empty: bool = False,
    ) -> int:
        """Claim, call ``callback``, mark done; stops cleanly on SIGTERM/SIGINT after the item in hand."""


def get_queue(name: str) -> ReliableFIFO:
    """The queue called ``name`` on the backend the settings choose for it."""
    raise NotImplementedError("The backends arrive with the queues issue.")


def ids_of(items: Iterable[Item | int]) -> list[int]:
    return [item.id if isinstance(item, Item) else int(item) for item in items]
