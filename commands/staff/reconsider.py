"""A connector changed (``Connector.save``, through the post-save receiver ``CommandsConfig``
connects): its waiting commands whose decision depends on it are decided again, in the save's own
transaction, and those that go now are queued. Not guaranteed: that they are sent within the poll
if no dispatcher runs.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ankusa_site.core.logs import log_event
from commands import retry
from commands.dispatch.sweep import sweep
from commands.models import Command
from commands.retry import Outlook
from commands.staff.plans import CHUNK, RETRYABLE, _phrase
from commands.states import State

logger = logging.getLogger("ankusa.commands.actions")


# --- a connector changed: its waiting commands decided again ---------------------------------------


@dataclass
class Reconsidered:
    """What a connector's change did to its waiting commands: ``going`` are queued now (the
    dispatch poll sends them within ``ANKUSA_DISPATCH_POLL_S``), ``parked`` newly wait, by reason."""

    going: int = 0
    parked: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        poll = f"{settings.ANKUSA_DISPATCH_POLL_S:g} s"
        if self.going:
            text = f"{self.going} of its commands will now go: queued now, sent within the dispatch poll ({poll})"
        else:
            text = "None of its waiting commands goes because of this change"
        if self.parked:
            text += f"; {sum(self.parked.values())} now wait: {_phrase(self.parked)}"
        return text + "."


@transaction.atomic  # joins the caller's (Connector.save's): the rows stay locked until it commits
def reconsider(connector, *, now: datetime | None = None) -> Reconsidered:
    """Decide again on ``connector``'s failed commands whose decision depends on it, and queue
    those that go now — in the caller's transaction (``Connector.save``'s), so the change and its
    consequences commit together and the dispatch poll sends them, not the next round.

    A stored skip reason is a cached decision: declaring the connector idempotent releases its
    ``not-idempotent`` commands, any save releases its ``after-fix`` ones (the fix a person just made
    should not wait out the re-check period), and un-declaring idempotency parks its retries. The
    decision is ``retry.decide``'s, with the connector as it is now; a pending resend is left alone
    (a person decided), and so are outlooks no connector changes (``never``, unknown).
    """
    now = now or timezone.now()
    result = Reconsidered()
    waiting = Command.objects.filter(
        connector=connector, state=State.FAILED, resend_by__isnull=True, last_outlook__in=RETRYABLE
    )
    # Locked until the save commits, so a sweep or a resend cannot move one between this decision
    # and its write; one a sweeper holds is left to that sweeper, which decides with the new row.
    rows = waiting.select_for_update(skip_locked=True, of=("self",)).values_list(
        "pk", "last_outlook", "attempts", "next_attempt_at", "skip_reason"
    )
    released: list[int] = []
    parked: dict[str, list[int]] = {}
    for pk, outlook, attempts, next_attempt_at, skip_reason in rows.iterator(chunk_size=2000):
        after_fix = outlook == Outlook.AFTER_FIX
        decision = retry.decide(
            dispatchable=True,
            outlook=outlook,
            attempts=attempts,
            next_attempt_at=None if after_fix else next_attempt_at,  # a fix is checked at once
            idempotent=connector.idempotent,
            now=now,
        )
        if decision.take:
            released.append(pk)
        elif decision.skip != skip_reason:
            parked.setdefault(decision.skip, []).append(pk)
    for start in range(0, len(released), CHUNK):
        chunk = released[start : start + CHUNK]
        Command.objects.filter(pk__in=chunk, state=State.FAILED).update(
            next_attempt_at=now, skip_reason="", skip_decided_at=None
        )
    for reason, ids in parked.items():
        for start in range(0, len(ids), CHUNK):
            Command.objects.filter(pk__in=ids[start : start + CHUNK], state=State.FAILED).update(
                skip_reason=reason, skip_decided_at=now
            )
        result.parked[reason] = len(ids)
    if released:
        result.going = sweep(now, connector=connector.pk).taken
    if released or parked:
        log_event(
            logger, "reconsidered", connector=connector.pk, going=result.going, parked=dict(result.parked)
        )
    return result
