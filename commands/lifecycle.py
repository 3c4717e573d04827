"""A command's life as intake and dispatch both see it: the decision at its birth and at every sweep
(:func:`decide_for` over ``DECISION_FIELDS``), and what its queue item carries (:func:`item_payload`
on the ``commands`` queue, :func:`commands_queue`).

Guaranteed: a queue write made with :func:`with_commit` / :func:`enqueue_with_commit` is never seen
before the state change it goes with commits (the database queue joins the transaction; any other
backend is written after the commit). Not guaranteed: that a crash between that commit and the write
leaves no ``queued`` command without an item (``commands.dispatch.recovery`` repairs it).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from commands import retry, wake
from commands.states import State, dispatchable
from queues.backends import get_queue
from queues.fifo import ReliableFIFO

QUEUE_NAME = "commands"


def commands_queue() -> ReliableFIFO:
    return get_queue(QUEUE_NAME)


def item_payload(command_id: int, attempt: int, *, probe: bool = False) -> dict:
    """What a queue item carries: the command and the attempt number the sweep decided on (and
    whether it probes a held connector, ``commands.dispatch.hold``)."""
    return {"command": command_id, "attempt": attempt, **({"probe": True} if probe else {})}


def with_commit(queue: ReliableFIFO, write: Callable[[], object]) -> None:
    """Run a queue write as part of the surrounding transaction (``ReliableFIFO.on_commit``).

    A queue that joins the transaction commits a command's state change and its queue item
    together. Any other is written after the commit, so no worker sees a command before its state
    is committed; a crash in between leaves a command ``queued`` without an item (which
    ``commands.dispatch.recovery.recover`` repairs) or a finished item still busy (a stale no-op
    when reclaimed).
    """
    queue.on_commit(write)


def enqueue_with_commit(queue: ReliableFIFO, payloads: list[dict]) -> None:
    if payloads:
        queue.enqueue_on_commit(*payloads)
        wake.after_enqueue()  # the queue wakes the loops itself; Celery is asked (commands.wake)


def decide_for(row: dict, now: datetime) -> retry.Decision:
    """The retry decision for a command read as a dict (``state``, ``last_outlook``, ...).

    A failed command a person resent (``resend_by``, see ``commands.staff.actions``) is taken whatever the
    decision would say: the person decided. Once — the send's outcome clears the mark.
    """
    if row.get("resend_by") is not None and row["state"] == State.FAILED:
        return retry.Decision(
            take=True, attempt=row["attempts"] + 1, next_attempt_at=now + retry.AGAIN_BACKOFF[0]
        )
    return retry.decide(
        dispatchable=dispatchable(row["state"]),
        outlook=row["last_outlook"] or None,
        attempts=row["attempts"],
        next_attempt_at=row["next_attempt_at"],
        idempotent=row["connector__idempotent"],
        now=now,
    )


DECISION_FIELDS = (
    "id",
    "state",
    "last_outlook",
    "attempts",
    "next_attempt_at",
    "connector__idempotent",
    "resend_by",
)
