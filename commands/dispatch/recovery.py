""":func:`recover`: settles what dead workers left behind — a command ``dispatching`` past the
visibility timeout becomes ``failed`` (``WorkerLost``, no outlook), expired items go back to the
queue, a ``queued`` command with no item gets one. Never sends anything, so never twice; a command
whose outcome the caller holds unwritten is not taken for lost.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from commands.dispatch.sends import WORKER_LOST, WORKER_LOST_DETAIL
from commands.lifecycle import DECISION_FIELDS, commands_queue, decide_for, enqueue_with_commit, item_payload
from commands.models import Attempt, Command
from commands.states import Event, State
from queues.fifo import ReliableFIFO


@dataclass
class RecoverSummary:
    worker_lost: int = 0
    items_requeued: int = 0
    lost_requeued: int = 0
    complete: bool = field(default=True, compare=False)  # False: stopped at its bound, more to do


# Commands (or queue items) recovery settles per transaction: a backlog of thousands costs a few
# dozen statements, and a bounded recovery looks at its bound between two of them.
RECOVER_BATCH = 500


def recover(
    now: datetime | None = None,
    *,
    queue: ReliableFIFO | None = None,
    pending: set[int] = frozenset(),
    until: Callable[[], bool] = lambda: False,
    batch: int | None = None,
) -> RecoverSummary:
    """Settle what dead workers left behind (see the module docstring), ``batch`` rows a
    transaction.

    ``pending``: commands whose outcome the caller holds, not written yet (the database was down):
    their worker is alive, so they are not lost, whatever their age. ``until``: asked before each
    batch; once it says True the recovery stops there (``complete`` False) and leaves the rest to
    the next one — how ``--max-seconds`` and a stopping loop bound it. Every batch is whole.
    """
    now = now or timezone.now()
    queue = queue or commands_queue()
    batch = batch or RECOVER_BATCH
    visibility = timedelta(seconds=settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S)
    summary = RecoverSummary()

    def bounded() -> bool:
        if until():
            summary.complete = False
        return not summary.complete

    abandoned = Command.objects.filter(state=State.DISPATCHING, state_changed_at__lt=now - visibility)
    if pending:
        abandoned = abandoned.exclude(pk__in=pending)
    after = 0
    while not bounded():
        with transaction.atomic():
            # Locked, so each row's decision holds until the batch commits; a row another recovery
            # holds is its to settle.
            rows = list(
                abandoned.filter(pk__gt=after)
                .order_by("pk")
                .select_for_update(skip_locked=True, of=("self",))
                .values(*DECISION_FIELDS, "state_changed_at")[:batch]
            )
            if not rows:
                break
            after = rows[-1]["id"]
            skips: dict[str, list[int]] = defaultdict(list)
            for row in rows:
                decision = decide_for(
                    {**row, "state": State.FAILED, "last_outlook": None, "resend_by": None}, now
                )
                skips[decision.skip or ""].append(row["id"])
            for skip, ids in skips.items():
                moved = Command.objects.filter(pk__in=ids).transition(
                    State.DISPATCHING,
                    Event.FAIL,
                    now,
                    last_outlook="",
                    last_error_class=WORKER_LOST,
                    last_error=WORKER_LOST_DETAIL,
                    resend_by=None,  # a resend is spent by its send, even one whose worker died
                    skip_reason=skip,
                    skip_decided_at=now,
                )
                if moved != len(ids):  # the rows are locked: anything else is a bug, so undo the batch
                    raise RuntimeError(f"recovery moved {moved} of {len(ids)} locked commands")
            Attempt.objects.bulk_create(
                Attempt(
                    command_id=row["id"],
                    number=row["attempts"],
                    started_at=row["state_changed_at"],
                    finished_at=now,
                    error_class=WORKER_LOST,
                    error_message=WORKER_LOST_DETAIL,
                    manual=row["resend_by"] is not None,
                    manual_by_id=row["resend_by"],
                )
                for row in rows
            )
            summary.worker_lost += len(rows)
        if len(rows) < batch:
            break

    while not bounded():
        expired = queue.handle_expired(visibility, action="requeue", limit=batch)
        summary.items_requeued += len(expired)
        if len(expired) < batch:
            break

    # A queued command whose item would have been claimed by now, had it one: claims are strictly
    # FIFO, so its item would be older than the oldest one still waiting. The visibility timeout
    # is the slack between a state change and its enqueue (a commit apart, normally milliseconds).
    cutoff = now - visibility - (queue.age("main") or timedelta(0))
    lost = Command.objects.filter(state=State.QUEUED, state_changed_at__lt=cutoff)
    after = 0
    while not bounded():
        with transaction.atomic():
            rows = list(
                lost.filter(pk__gt=after)
                .order_by("pk")
                .select_for_update(skip_locked=True, of=("self",))
                .values("id", "attempts")[:batch]
            )
            if not rows:
                break
            after = rows[-1]["id"]
            # Touching state_changed_at keeps the next round from enqueuing them again.
            Command.objects.filter(pk__in=[row["id"] for row in rows]).update(state_changed_at=now)
            enqueue_with_commit(queue, [item_payload(row["id"], row["attempts"] + 1) for row in rows])
            summary.lost_requeued += len(rows)
        if len(rows) < batch:
            break
    return summary


def recovery_line(r: RecoverSummary) -> str:
    line = f"recovered {r.worker_lost} lost sends, {r.items_requeued} expired items, {r.lost_requeued} lost items"
    return line if r.complete else f"{line} (stopped at its bound, the rest next time)"
