"""What a send is while the loop handles it: a claimed item with its command and attempt (``_Entry``),
a finished send (:class:`Sent`), a send never started (:class:`Unstarted`), and the ``WorkerLost``
mark a send gets when nothing is known of its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from commands.dispatch import adapters
from commands.models import Command
from queues.fifo import Item

WORKER_LOST = "WorkerLost"


WORKER_LOST_DETAIL = "the dispatch worker stopped during the send; whether it went out is unknown"


@dataclass(frozen=True)
class Sent:
    """A finished send: what went out, when, and how it went."""

    command: Command
    attempt: int
    started: datetime
    finished: datetime
    outcome: adapters.Outcome


@dataclass(frozen=True)
class _Entry:
    item: Item
    command: Command
    attempt: int


@dataclass(frozen=True)
class Unstarted:
    """What a sender hands the recorder for a send it never started: its start statement failed
    (``stamp``: the time that statement would have written), or it was never asked (None)."""

    stamp: datetime | None = None
