"""Dispatch this command now — and if not, why not. A faithful port of ``seeds/retry-decision.ts``.

Pure: no database, no adapter, no clock. The time is an argument, so "again in 10 minutes" is
tested by changing a value, not by waiting.

**The adapter answers with one of three outlooks**, because failures are not alike (two were met
on 2026-09-02: a 503 because the receiver's credential was missing — fixable — and a 400 for
``ITEM-1`` — not fixable by sending the same command again):

    again       worth trying again as it is      we could not reach them, or they wobbled
    after-fix   goes out as it is once fixed     a configuration problem
    never       will never work as sent          the instruction itself is wrong

**``after-fix`` is never capped.** It is not a retry but a wait: hammering does not fix it, and
the moment a person fixes the configuration it should go out on the next round. Capping it would
make the person fix it *and then* resend by hand — exactly the 2026-09-02 incident. Only
``again`` is capped: three short tries that fail mean something other than a wobbling network,
and a person should look.

**Idempotency separates the first attempt from a retry.** ``approved → dispatch`` is the first
attempt and is always taken, declared idempotency or not: once cannot make two. ``failed →
dispatch`` is a retry and is taken only for a connector that declared that two sends are one
instruction. **Unknown means don't send**: an outlook the adapter did not give, or an idempotency
nobody declared, leaves the command in the failed list for a person — if we sent twice on
"probably fine", two instructions would stand in the field.

What this does not do: it never looks at the command's history beyond ``attempts``, and it does
not know whether the last attempt actually reached the receiver (that is the adapter's outlook).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import models


class Outlook(models.TextChoices):
    """The adapter's answer for a failure. None (blank) means it said nothing — not ``never``."""

    AGAIN = "again", "again"
    AFTER_FIX = "after-fix", "after-fix"
    NEVER = "never", "never"


class SkipReason(models.TextChoices):
    """Why a command was not taken, so every list separates "fix this" from "not our side"."""

    NOT_DISPATCHABLE = "not-dispatchable", "not dispatchable"
    BACKING_OFF = "backing-off", "backing off"
    NEVER = "never", "never"
    ATTEMPTS_SPENT = "attempts-spent", "attempts spent"
    OUTLOOK_UNKNOWN = "outlook-unknown", "outlook unknown"
    NOT_IDEMPOTENT = "not-idempotent", "not idempotent"


# `again` backs off 30 s · 2 min · 10 min, then stops. The first step equals the dispatch loop's
# period (ANKUSA_DISPATCH_INTERVAL_S): no new rhythm is invented.
AGAIN_BACKOFF = (timedelta(seconds=30), timedelta(minutes=2), timedelta(minutes=10))
# `after-fix` is looked at every 10 minutes, forever: short is wasted work, long leaves a fixed
# connector waiting.
AFTER_FIX_PERIOD = timedelta(minutes=10)


@dataclass(frozen=True)
class Decision:
    take: bool
    skip: SkipReason | None = None
    # The attempt number this dispatch will be (the first is 1).
    attempt: int | None = None
    # When to look again if this attempt fails; None means never again by itself.
    next_attempt_at: datetime | None = None


def _due_time(value: datetime | str | None) -> datetime | None:
    """The due time, or None when there is none or it cannot be read (which must not block)."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    # The seed parses an ISO time without an offset as local time; the site's time zone is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def decide(
    *,
    dispatchable: bool,
    outlook: str | None,
    attempts: int | None,
    next_attempt_at: datetime | str | None,
    idempotent: bool | None,
    now: datetime,
) -> Decision:
    """Take this command now, or say why not.

    ``dispatchable``: the state machine's answer (``states.dispatchable(state)``). ``outlook``: the
    adapter's answer to the last failure (none before the first attempt). ``attempts``: dispatches
    so far. ``next_attempt_at``: when to look again (none means now). ``idempotent``: only ``True``
    counts — a declaration, not a guess.
    """
    if not dispatchable:
        return Decision(take=False, skip=SkipReason.NOT_DISPATCHABLE)

    done = attempts if isinstance(attempts, int) and not isinstance(attempts, bool) and attempts > 0 else 0

    # The first attempt: approved, never sent. Neither backoff nor idempotency is asked — once
    # cannot make two, and the adapter has said nothing yet. This branch also picks up a command
    # whose process died between the commit and the send.
    if done == 0:
        return Decision(take=True, attempt=1, next_attempt_at=now + AGAIN_BACKOFF[0])

    # A retry: from here the adapter's answer and the connector's nature are asked.
    if outlook not in Outlook.values:
        return Decision(take=False, skip=SkipReason.OUTLOOK_UNKNOWN)
    if outlook == Outlook.NEVER:
        return Decision(take=False, skip=SkipReason.NEVER)
    if idempotent is not True:
        return Decision(take=False, skip=SkipReason.NOT_IDEMPOTENT)

    due = _due_time(next_attempt_at)
    if due is not None and now < due:
        return Decision(take=False, skip=SkipReason.BACKING_OFF)

    if outlook == Outlook.AFTER_FIX:
        return Decision(take=True, attempt=done + 1, next_attempt_at=now + AFTER_FIX_PERIOD)

    if done >= len(AGAIN_BACKOFF):
        return Decision(take=False, skip=SkipReason.ATTEMPTS_SPENT)
    return Decision(take=True, attempt=done + 1, next_attempt_at=now + AGAIN_BACKOFF[done])


def resend_due_times(count: int, now: datetime, *, per_second: float, rng: random.Random) -> list[datetime]:
    """Due times for ``count`` resends: the i-th at ``i / per_second`` seconds, plus a jitter of up
    to half a slot, so no second holds more than ``per_second + 1`` of them."""
    slot = 1.0 / per_second
    # The first one at once (a lone resend goes when the dispatchers wake), the others jittered.
    return [now + timedelta(seconds=i * slot + (rng.uniform(0, slot / 2) if i else 0)) for i in range(count)]
