"""The outage hold: a connector whose receiver keeps failing stops being sent to, by itself, and
starts again at the first success — so a receiver's outage costs its commands no tries.

* **Counting** (:func:`observe`, in the recorder's transaction with the outcomes): each connector's
  ``again`` failures in a row across its commands (``outage_failures``, the run started at
  ``outage_since``), by a conditional update of its row, so any number of dispatcher threads and
  processes count one run. Any other outcome ends the run; a run older than ``ANKUSA_HOLD_WINDOW_S``
  starts again. ``ANKUSA_HOLD_AFTER_FAILURES`` (or the connector's ``hold_after_failures``; 0: never)
  in a row holds it (``held_since``): a log line ``connector_held`` and the metric
  ``ankusa_connector_holds_total{event="held"}``.
* **Held**: the sweep takes none of its commands (:func:`stopped_ids`) and the drain sets aside one
  claimed meanwhile (:func:`set_aside`, back to where the sweep took it from, no attempt spent).
  One probe every ``ANKUSA_HOLD_PROBE_S``, doubling up to ten times that (:func:`probes_due`): for an
  idempotent connector an ordinary send of its due command with the fewest attempts (its attempt
  counts like any other and is judged by the seed's retry decision, so a probe never spends more
  than one try of a command that still has some); for any other a ``HEAD`` of its URL, which is no
  command's send (an answer the adapter would not call ``again`` means it is back).
* **Released** (:func:`release`) by the first success of any of its sends or a probe: its waiting
  commands get due times spread at ``ANKUSA_RESEND_PER_S`` (as a bulk resend's), the log line
  ``connector_released`` and ``{event="released"}``.

Not guaranteed: a send claimed before the hold committed still goes (a dispatcher reads a claimed
batch's connectors with its commands), and the count is per send, not per receiver outage (a
receiver failing one send in two never holds). The hold never changes how a failure is judged
(``commands.retry``).
"""

from __future__ import annotations

import json
import logging
import random
from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from ankusa_site.core import metrics
from ankusa_site.core.logs import log_event
from commands import retry
from commands.dispatch import statements
from commands.lifecycle import commands_queue, with_commit
from commands.models import PARKED_REASONS, Command, Connector
from commands.retry import Outlook
from commands.states import Event, State

logger = logging.getLogger("ankusa.commands.hold")

# The probe interval doubles after each failed probe, up to this many times the first.
PROBE_GROWTH_CAP = 10


def threshold(connector: Connector) -> int:
    """``again`` failures in a row that hold ``connector`` (0: it never holds)."""
    own = connector.hold_after_failures
    return settings.ANKUSA_HOLD_AFTER_FAILURES if own is None else own


def probe_interval(failed_probes: int) -> timedelta:
    """The wait before the next probe after ``failed_probes`` failed ones."""
    first = settings.ANKUSA_HOLD_PROBE_S
    return timedelta(seconds=min(first * 2**failed_probes, first * PROBE_GROWTH_CAP))


def stopped() -> Q:
    """Connectors that send nothing now: paused or held."""
    return Q(paused_at__isnull=False) | Q(held_since__isnull=False)


def stopped_ids() -> list[int]:
    """The connectors the sweep takes no commands of (one small query a sweep)."""
    return list(Connector.objects.filter(stopped()).values_list("pk", flat=True))


# --- counting -------------------------------------------------------------------------------------


def observe(recorded: list, now: datetime, *, failing: list[int] | None = None) -> None:
    """Count the outcomes of ``recorded`` sends (``commands.dispatch.sends.Sent``) per connector, hold a connector
    whose run reached its threshold and release a held one that succeeded — in the caller's
    transaction (the recorder's, with the outcomes). A connector none of whose sends failed costs
    one shared query (``statements.failing_or_held`` of :func:`to_look`, or ``failing`` if the
    caller asked it already), and a write only if it was failing or held."""
    sends = _by_connector(recorded)
    runs = {pk: _tail(group) for pk, group in sends.items()}
    ended = [pk for pk, (tail, broken, _) in runs.items() if broken]
    if ended:  # a run ended here: only a connector that was failing or held has anything to clear
        for pk in statements.failing_or_held(ended) if failing is None else failing:
            tail, _, succeeded = runs[pk]
            if succeeded:
                release(pk, now)
            if tail == 0:
                Connector.objects.filter(pk=pk).update(outage_failures=0, outage_since=None)
    for pk, (tail, broken, _) in runs.items():
        if tail:
            first = sends[pk][-tail].finished  # the run's first failure in this batch
            _count(sends[pk][0].command.connector, tail, restart=broken, first=first, now=now)


def to_look(recorded: list) -> list[int]:
    """The connectors :func:`observe` asks ``statements.failing_or_held`` about for ``recorded``:
    those whose run of ``again`` failures an outcome in it ended."""
    return [pk for pk, group in _by_connector(recorded).items() if _tail(group)[1]]


def _by_connector(recorded: list) -> dict[int, list]:
    """``recorded``'s sends by connector, each connector's in the order they finished."""
    sends: dict[int, list] = defaultdict(list)
    for one in recorded:
        sends[one.command.connector_id].append(one)
    for group in sends.values():
        group.sort(key=lambda one: one.finished)
    return sends


def _tail(group: list) -> tuple[int, bool, bool]:
    """``(again failures at the end, whether another outcome came before them, any success)``."""
    tail = 0
    for one in reversed(group):
        if one.outcome.ok or one.outcome.outlook != Outlook.AGAIN:
            break
        tail += 1
    return tail, tail < len(group), any(one.outcome.ok for one in group)


def _count(connector: Connector, failures: int, *, restart: bool, first: datetime, now: datetime) -> None:
    """Add ``failures`` to the connector's run (or start a new one) and hold it at its threshold:
    conditional updates of its row, which stays locked until the outcomes commit."""
    rows = Connector.objects.filter(pk=connector.pk)
    if restart:  # another outcome came first in this batch: the run starts here
        rows.update(outage_failures=failures, outage_since=first)
    else:
        going = Q(outage_since__gte=now - timedelta(seconds=settings.ANKUSA_HOLD_WINDOW_S))
        rows.update(
            outage_failures=Case(When(going, then=F("outage_failures") + failures), default=Value(failures)),
            outage_since=Case(When(going, then=F("outage_since")), default=Value(first)),
        )
    limit = threshold(connector)
    if not limit:
        return
    held = Connector.objects.filter(
        pk=connector.pk, held_since__isnull=True, outage_failures__gte=limit
    ).update(held_since=now, probe_at=now + probe_interval(0), probes=0)
    if held:
        transaction.on_commit(lambda: _report("held", connector.pk, failures=limit))


def _report(event: str, pk: int, **fields) -> None:
    metrics.labelled(metrics.CONNECTOR_HOLDS, event).inc()
    log_event(logger, f"connector_{event}", level=logging.WARNING if event == "held" else logging.INFO,
              connector=pk, **fields)  # fmt: skip


# --- release --------------------------------------------------------------------------------------


def release(pk: int, now: datetime) -> int | None:
    """End connector ``pk``'s hold, if it is held, and spread its waiting commands at
    ``ANKUSA_RESEND_PER_S``; how many were spread (None: it was not held). In the caller's
    transaction."""
    ended = Connector.objects.filter(pk=pk, held_since__isnull=False).update(
        held_since=None, probe_at=None, probes=0, outage_failures=0, outage_since=None
    )
    if not ended:
        return None
    spread = pace_waiting(pk, now)
    transaction.on_commit(lambda: _report("released", pk, waiting=spread))
    transaction.on_commit(wake)
    return spread


def wake() -> None:
    """Tell the dispatchers released commands are due (after the release's or resume's commit):
    a woken loop sweeps at once (``commands.wake``), Celery is asked for the poll."""
    from commands import wake as waking  # this function's name would shadow the module

    waking.commands_due(commands_queue())


def waiting(pk: int):
    """Connector ``pk``'s commands the sweep would decide on once it sends again."""
    return Command.objects.filter(connector_id=pk, state__in=[State.APPROVED, State.FAILED]).exclude(
        skip_reason__in=PARKED_REASONS
    )


TABLE = Command._meta.db_table
PACE_SQL_POSTGRESQL = f"""
UPDATE {TABLE} AS command SET next_attempt_at = v.due
FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(id, due) WHERE command.id = v.id
"""
PACE_SQL = f"""
UPDATE {TABLE} SET next_attempt_at = v.due
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS due FROM json_each(%s)) AS v
WHERE {TABLE}.id = v.id
"""
CHUNK = 500


def pace_waiting(pk: int, now: datetime, *, rng: random.Random | None = None) -> int:
    """Give connector ``pk``'s waiting commands due times at ``ANKUSA_RESEND_PER_S`` (oldest first,
    the jitter of a bulk resend), a command's own later due time kept: what a hold or a pause held
    back goes out at the resend rate, not at once. Returns how many."""
    rows = list(waiting(pk).order_by("pk").values_list("pk", "next_attempt_at"))
    times = retry.resend_due_times(
        len(rows), now, per_second=settings.ANKUSA_RESEND_PER_S, rng=rng or random.Random()
    )
    pairs = [(pk, max(slot, own) if own else slot) for (pk, own), slot in zip(rows, times, strict=True)]
    stamp = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        for start in range(0, len(pairs), CHUNK):
            chunk = pairs[start : start + CHUNK]
            if connection.vendor == "postgresql":
                cursor.execute(PACE_SQL_POSTGRESQL, [[p for p, _ in chunk], [due for _, due in chunk]])
            else:
                cursor.execute(PACE_SQL, [json.dumps([[p, stamp(due)] for p, due in chunk])])
    return len(pairs)


# --- probes ---------------------------------------------------------------------------------------


def probes_due(now: datetime) -> set[int]:
    """Claim the probe of each held connector whose probe is due (one sweeper wins each, by a
    conditional update), and return the commands the sweep takes as probes; a connector that is
    not idempotent is probed here by a ``HEAD`` instead (:func:`health_probe`)."""
    due = Connector.objects.filter(held_since__isnull=False, paused_at__isnull=True, probe_at__lte=now)
    taken: set[int] = set()
    for connector in due:
        claimed = Connector.objects.filter(
            pk=connector.pk, held_since__isnull=False, probe_at=connector.probe_at
        )
        if not claimed.update(probe_at=now + probe_interval(connector.probes + 1), probes=F("probes") + 1):
            continue  # another sweeper probes it
        if not connector.idempotent:
            if health_probe(connector):
                with transaction.atomic():
                    release(connector.pk, now)
            continue
        # Fewest attempts first: a probe never takes a command's last try while another has more.
        probe = Command.objects.due(now).filter(connector_id=connector.pk).order_by("attempts", "pk").first()
        if probe is not None:
            taken.add(probe.pk)
        log_event(
            logger,
            "connector_probe",
            connector=connector.pk,
            command=probe and probe.pk,
            probes=connector.probes + 1,
        )
    return taken


def health_probe(connector: Connector) -> bool:
    """Whether a ``HEAD`` of the connector's URL gets an answer the adapter would not call
    ``again`` (any other: the receiver is back, even a 405). No command is sent."""
    from commands.dispatch import event_loop
    from commands.dispatch.adapters import http, http_async

    if connector.kind != "http" or not connector.url:
        return False
    try:
        status, said = event_loop.run(http_async.head(connector))
    except Exception as exc:  # refused, timed out, not allowed: still down
        log_event(logger, "connector_probe", connector=connector.pk, ok=False, error=type(exc).__name__)
        return False
    outlook = http.outlook_for(status, said, connector.status_map or {})
    log_event(logger, "connector_probe", connector=connector.pk, status=status)
    return outlook != Outlook.AGAIN


# --- the drain's guard ----------------------------------------------------------------------------


def set_aside(entries: list, queue) -> list:
    """The claimed sends (``commands.dispatch.sends._Entry``) that may go; those of a connector paused, or held
    (bar its probe), go back to where the sweep took them from — no attempt spent, their items
    finished — to wait with the connector's other commands."""
    kept, aside = [], []
    for entry in entries:
        connector = entry.command.connector
        if connector.paused_at or (connector.held_since and not entry.item.payload.get("probe")):
            aside.append(entry)
        else:
            kept.append(entry)
    if aside:
        with transaction.atomic():
            for entry in aside:
                event = Event.SET_ASIDE if entry.attempt == 1 else Event.SET_ASIDE_RETRY
                Command.objects.filter(pk=entry.command.pk, attempts=entry.attempt - 1).transition(
                    State.QUEUED,
                    event,
                    timezone.now(),
                    next_attempt_at=None,  # due when it sends again
                )
            with_commit(queue, lambda: queue.done(*(entry.item for entry in aside)))
        log_event(logger, "set_aside", count=len(aside), commands=[e.command.pk for e in aside][:20])
    return kept
