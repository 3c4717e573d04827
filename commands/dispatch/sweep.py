""":func:`sweep`: decides on every due command through ``commands.retry`` (``decide_for``): a taken
one moves ``→ queued`` with one item on the ``commands`` queue, a skipped one gets its reason written.
Two sweepers split the due commands between them (rows locked, ``SKIP LOCKED``) instead of deciding
twice.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ankusa_site.core.logs import log_event
from commands.dispatch import hold
from commands.lifecycle import DECISION_FIELDS, commands_queue, decide_for, enqueue_with_commit, item_payload
from commands.models import Command
from commands.states import Event
from queues.fifo import ReliableFIFO

logger = logging.getLogger("ankusa.commands.dispatch")


@dataclass
class SweepSummary:
    taken: int = 0
    skipped: Counter = field(default_factory=Counter)


def sweep(
    now: datetime | None = None,
    *,
    batch: int | None = None,
    queue: ReliableFIFO | None = None,
    connector: int | None = None,
) -> SweepSummary:
    """Decide on every due command: queue the taken ones, write the reason on the others.

    Each batch is read with its rows locked (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's
    write transaction serialises sweepers), so two sweepers split the due commands between them
    instead of deciding twice, and the updates can go by group rather than row by row.
    """
    now = now or timezone.now()
    batch = batch or settings.ANKUSA_DISPATCH_BATCH
    queue = queue or commands_queue()
    summary = SweepSummary()
    # Paused and held connectors: none of their commands is taken, bar a held one's probe.
    probes = hold.probes_due(now) if connector is None else set()
    stopped = hold.stopped_ids()
    after = 0
    while True:
        with transaction.atomic():
            due = Command.objects.due(now).filter(id__gt=after).order_by("id")
            if stopped:
                due = due.filter(~Q(connector_id__in=stopped) | Q(pk__in=probes))
            if connector is not None:  # a saved connector's commands (commands.staff.reconsider)
                due = due.filter(connector_id=connector)
            rows = list(
                due.select_for_update(skip_locked=True, of=("self",)).values(*DECISION_FIELDS)[:batch]
            )
            if not rows:
                return summary
            after = rows[-1]["id"]
            taken: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
            skipped: dict[str, list[int]] = defaultdict(list)
            for row in rows:
                decision = decide_for(row, now)
                if decision.take:
                    taken[row["state"], decision.next_attempt_at].append((row["id"], decision.attempt))
                else:
                    skipped[decision.skip].append(row["id"])
            payloads = []
            for (state, next_attempt_at), group in taken.items():
                ids = [pk for pk, _ in group]
                moved = Command.objects.filter(pk__in=ids).transition(
                    state,
                    Event.DISPATCH,
                    now,
                    next_attempt_at=next_attempt_at,
                    skip_reason="",
                    skip_decided_at=now,
                )
                if moved != len(ids):  # the rows are locked: anything else is a bug, so undo the batch
                    raise RuntimeError(f"sweep moved {moved} of {len(ids)} locked commands")
                payloads.extend(item_payload(pk, attempt, probe=pk in probes) for pk, attempt in group)
            for reason, ids in skipped.items():
                Command.objects.filter(pk__in=ids).update(skip_reason=reason, skip_decided_at=now)
                summary.skipped[reason] += len(ids)
                # Once per decision: a parked reason leaves the command out of later sweeps.
                log_event(logger, "skipped", reason=reason, count=len(ids), commands=ids[:20])
            summary.taken += len(payloads)
            enqueue_with_commit(queue, payloads)
        if len(rows) < batch:
            return summary
