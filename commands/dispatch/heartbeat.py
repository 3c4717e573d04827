"""Whether the dispatch loop is alive: each dispatch process records its last round in the database.

:func:`beat` is called once per round by whatever runs the rounds — ``commands.dispatch.rounds.run_round``
(the ``manage.py dispatch`` loop) and the Celery ``sweep`` task — and upserts one
``DispatcherHeartbeat`` row named ``host:pid``. It works on SQLite and PostgreSQL alike (no Redis),
costs one UPDATE per round (an INSERT the first time), and never raises: a heartbeat that cannot be
written (the database is down) is what the dashboard reports as a stale one.

:func:`status` is the dashboard's reading: every process seen in the last ``SHOWN``, newest first,
and a warning when none has run a round for ``2 × ANKUSA_DISPATCH_POLL_S + ANKUSA_DISPATCH_INTERVAL_S``
(a round is due every interval; twice the poll period is the slack of one late round start).

What it does not guarantee: that the process is still running right now (a row is only as fresh as
its last round's start: one round longer than the limit, draining a large backlog, reads as a
stale loop until it ends), or that a round did useful work (its summary is in the process's log).
Rows of processes gone for longer than ``FORGOTTEN`` are deleted by the next beat.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from commands.models import DispatcherHeartbeat

logger = logging.getLogger("ankusa.commands.heartbeat")

# The dashboard lists the processes seen this recently (a restart makes a new host:pid row).
SHOWN = timedelta(hours=24)
# A process silent this long is forgotten: its row is deleted by the next beat of any process.
FORGOTTEN = timedelta(days=7)


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def beat(kind: str, now: datetime | None = None) -> None:
    """Record that this process ran a round now (``kind``: "loop" or "celery"). Never raises."""
    now = now or timezone.now()
    name = process_name()
    try:
        # A savepoint: a beat that fails never spoils a transaction its caller may have open.
        with transaction.atomic():
            updated = DispatcherHeartbeat.objects.filter(name=name).update(
                last_round_at=now, rounds=F("rounds") + 1, kind=kind
            )
            if updated:
                return
            try:
                with transaction.atomic():
                    DispatcherHeartbeat.objects.create(
                        name=name, kind=kind, started_at=now, last_round_at=now
                    )
            except IntegrityError:  # a process of the same name (a reused pid) wrote it meanwhile
                DispatcherHeartbeat.objects.filter(name=name).update(last_round_at=now, kind=kind)
            # Once per new process, not per round: the table holds a row per process ever seen.
            DispatcherHeartbeat.objects.filter(last_round_at__lt=now - FORGOTTEN).delete()
    except Exception:  # noqa: BLE001 - the round goes on; a missing beat shows on the dashboard
        logger.warning("dispatch heartbeat: not recorded", exc_info=True)


def stale_after() -> timedelta:
    """How long without a round before the dashboard warns."""
    return timedelta(seconds=2 * settings.ANKUSA_DISPATCH_POLL_S + settings.ANKUSA_DISPATCH_INTERVAL_S)


@dataclass(frozen=True)
class Status:
    processes: list[DispatcherHeartbeat]
    latest: datetime | None
    stale_after: timedelta
    alive: bool

    def warning(self) -> str:
        if self.alive:
            return ""
        limit = f"{self.stale_after.total_seconds():g} s"
        if self.latest is None:
            return (
                "No dispatch process has run a round: nothing is sent. Start `manage.py dispatch` "
                "(or Celery beat and a worker)."
            )
        return (
            f"No dispatch process has run a round for more than {limit}: nothing is sent until one "
            "runs again — unless one round is taking that long (a large backlog; its log says so). "
            "Check the `manage.py dispatch` process (or Celery beat and its workers)."
        )


def status(now: datetime | None = None) -> Status:
    """The processes seen in the last ``SHOWN`` (one query) and whether any ran a round recently."""
    now = now or timezone.now()
    processes = list(DispatcherHeartbeat.objects.filter(last_round_at__gte=now - SHOWN)[:50])
    latest = processes[0].last_round_at if processes else None
    limit = stale_after()
    return Status(processes, latest, limit, latest is not None and now - latest <= limit)
