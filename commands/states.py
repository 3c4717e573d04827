"""The one table of a command's states and the events that move it between them.

    draft ──approve──▶ approved ──dispatch──▶ queued ──start──▶ dispatching ──succeed──▶ succeeded
                                                ▲                    │
                                                └──dispatch── failed ◀──fail──┘
    draft / approved / failed ──cancel──▶ cancelled

``queued → set-aside`` undoes a dispatch whose start never came (the connector was paused or
held meanwhile): a first attempt back to ``approved``, a retry back to ``failed``.
``approved → dispatch`` is a command's first attempt, ``failed → dispatch`` a retry (the retry
decision in ``commands.retry`` says which may go). A command is *dispatchable* when
``next_state(state, "dispatch")`` exists — the seed's ``dispatchable`` input.

This module only says which moves exist. Making one is a conditional update whose row count is
checked (``Command.objects.transition``), so two workers racing for the same move cannot both
win. ``succeeded`` and ``cancelled`` are terminal: nothing leaves them, so a command that has
gone out can never be sent again by a state change (a resend of it is a new command).
"""

from __future__ import annotations

from django.db import models


class State(models.TextChoices):
    DRAFT = "draft", "draft"
    APPROVED = "approved", "approved"
    QUEUED = "queued", "queued"
    DISPATCHING = "dispatching", "dispatching"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class Event(models.TextChoices):
    APPROVE = "approve", "approve"
    DISPATCH = "dispatch", "dispatch"
    START = "start", "start"
    SUCCEED = "succeed", "succeed"
    FAIL = "fail", "fail"
    CANCEL = "cancel", "cancel"
    # A queued command of a connector paused or held since its sweep, claimed but never started:
    # back to where the sweep took it from (commands.dispatch.hold.set_aside), no attempt spent.
    SET_ASIDE = "set-aside", "set aside"
    SET_ASIDE_RETRY = "set-aside-retry", "set aside (a retry)"


TRANSITIONS: dict[tuple[str, str], str] = {
    (State.DRAFT, Event.APPROVE): State.APPROVED,
    (State.APPROVED, Event.DISPATCH): State.QUEUED,
    (State.FAILED, Event.DISPATCH): State.QUEUED,
    (State.QUEUED, Event.START): State.DISPATCHING,
    (State.QUEUED, Event.SET_ASIDE): State.APPROVED,
    (State.QUEUED, Event.SET_ASIDE_RETRY): State.FAILED,
    (State.DISPATCHING, Event.SUCCEED): State.SUCCEEDED,
    (State.DISPATCHING, Event.FAIL): State.FAILED,
    (State.DRAFT, Event.CANCEL): State.CANCELLED,
    (State.APPROVED, Event.CANCEL): State.CANCELLED,
    (State.FAILED, Event.CANCEL): State.CANCELLED,
}


def next_state(state: str, event: str) -> State | None:
    """The state ``event`` moves ``state`` to, or None when the table has no such move."""
    target = TRANSITIONS.get((state, event))
    return None if target is None else State(target)


def dispatchable(state: str) -> bool:
    return next_state(state, Event.DISPATCH) is not None
