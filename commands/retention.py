"""Retention: delete what is old and finished, in small batches, so the tables stop growing.

What goes, each after its own retention (``ANKUSA_RETAIN_*_DAYS``, or one ``older_than`` for all):

* **finished commands** — ``succeeded`` or ``cancelled`` whose last state change is older than
  the cutoff — with their attempts (the history of a finished command goes with it);
* **deliveries** received before the cutoff whose commands are all gone (a delivery is kept as
  long as one of its commands is: it is what that command came from);
* staff audit entries older than ``ANKUSA_RETAIN_AUDIT_DAYS``;
* connector health buckets no window reads any more (``commands.health.old_buckets``: minutes
  after 2 hours, hours after 2 days, whatever ``older_than`` says).

What never goes: a command that is not finished (``draft``, ``approved``, ``queued``,
``dispatching``, ``failed``) or its attempts, whatever its age: it still waits for the machine or a
person. Queue items need no pruning: both backends delete an item when it is done.

Why it is safe to run beside traffic: each batch is one short transaction over at most ``batch``
rows chosen by primary key (a cursor walks the table once, so rows a batch skips are not read
again), and the loop pauses between batches, so on SQLite an intake write waits at most one batch
and on PostgreSQL no lock outlives a batch. A deletion that races with a state change is harmless:
the batch re-checks the conditions in its own DELETE.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.utils import timezone

from commands import health
from commands.models import AuditEntry, Command, Delivery
from commands.states import State

FINISHED = (State.SUCCEEDED, State.CANCELLED)
DEFAULT_BATCH = 1000
# Between batches: long enough for a waiting intake write to take the lock, short enough that
# 200,000 rows go in well under a minute. On SQLite a writer that found the lock taken sleeps in
# its busy handler, up to 100 ms a step; a shorter pause lets the next batch take the lock first
# again and again, and one webhook could wait out several batches.
DEFAULT_PAUSE_S = 0.01
SQLITE_PAUSE_S = 0.11


def default_pause() -> float:
    return SQLITE_PAUSE_S if connection.vendor == "sqlite" else DEFAULT_PAUSE_S


@dataclass
class Table:
    """One prunable table: the rows that may go before ``cutoff``, and how long they are kept."""

    name: str
    candidates: Callable[[datetime], QuerySet]
    retain_setting: str
    # Called with now rather than a cutoff: the table keeps what it reads, not a setting's days.
    by_now: bool = False


@dataclass
class PruneReport:
    """Rows removed (or, in a dry run, that would be) per model label, e.g. ``commands.Attempt``."""

    removed: dict[str, int] = field(default_factory=dict)
    batches: int = 0

    def add(self, counts: dict[str, int]) -> None:
        for label, count in counts.items():
            if count:
                self.removed[label] = self.removed.get(label, 0) + count

    def line(self) -> str:
        parts = ", ".join(f"{count} {label}" for label, count in sorted(self.removed.items()))
        return f"removed {parts or 'nothing'} in {self.batches} batch(es)"


def finished_commands(cutoff: datetime) -> QuerySet:
    """Succeeded or cancelled before ``cutoff``."""
    return Command.objects.filter(state__in=FINISHED, state_changed_at__lt=cutoff)


def orphaned_deliveries(cutoff: datetime) -> QuerySet:
    """Received before ``cutoff`` and no longer the origin of any command."""
    return Delivery.objects.filter(received_at__lt=cutoff).exclude(
        Exists(Command.objects.filter(delivery=OuterRef("pk")))
    )


def old_audit_entries(cutoff: datetime) -> QuerySet:
    """Staff actions recorded before ``cutoff`` (their links to commands go with them)."""
    return AuditEntry.objects.filter(at__lt=cutoff)


# Commands first: a delivery becomes prunable once its commands are gone.
TABLES: list[Table] = [
    Table("commands", finished_commands, "ANKUSA_RETAIN_COMMANDS_DAYS"),
    Table("deliveries", orphaned_deliveries, "ANKUSA_RETAIN_DELIVERIES_DAYS"),
    Table("audit", old_audit_entries, "ANKUSA_RETAIN_AUDIT_DAYS"),
    Table("health", health.old_buckets, "", by_now=True),
]


def tables() -> list[Table]:
    return TABLES


def _batches(candidates: QuerySet, batch: int) -> Iterator[list[int]]:
    last = 0
    while True:
        ids = list(candidates.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[:batch])
        if not ids:
            return
        last = ids[-1]
        yield ids


def prune(
    *,
    older_than: timedelta | None = None,
    now: datetime | None = None,
    batch: int = DEFAULT_BATCH,
    pause_s: float | None = None,
    only: list[str] | None = None,
    dry_run: bool = False,
    progress: Callable[[str, int], None] | None = None,
) -> PruneReport:
    """Delete old finished rows table by table; ``dry_run`` counts what would go instead."""
    now = now or timezone.now()
    pause_s = default_pause() if pause_s is None else pause_s
    report = PruneReport()
    for table in tables():
        if only and table.name not in only:
            continue
        if table.by_now:
            cutoff = now
        else:
            cutoff = now - (older_than or timedelta(days=getattr(settings, table.retain_setting)))
        candidates = table.candidates(cutoff)
        if dry_run:
            report.add({candidates.model._meta.label: candidates.count()})
            continue
        for ids in _batches(candidates, batch):
            with transaction.atomic():
                # Re-checked inside the DELETE: a row that changed since it was listed stays.
                _, per_model = table.candidates(cutoff).filter(pk__in=ids).delete()
            report.add(per_model)
            report.batches += 1
            if progress:
                progress(table.name, len(ids))
            if pause_s:
                time.sleep(pause_s)
    return report
