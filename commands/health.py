"""Connector health: how each connector's sends have gone, kept as a summary written with them.

Per connector: sends and success rate over the **last hour** (the current minute and the 59
before it) and the **last day** (the current hour and the 23 before it, as the dashboard's
chart), p50/p95 send time in each, the last error and when, consecutive failures, and its commands
waiting by reason (``commands.staff.explain``'s keys, each counted up to ``CAP``).

**A summary table, not a GROUP BY over attempts, and not rolling counters.** Reading a day of
attempts for a page of connectors costs what the attempts table holds (a million rows a day at
1,000 connectors); rolling counters cannot forget the sends that leave a window. So
:func:`record` — called by the dispatch recorder in the transaction that writes a batch's attempt
rows — adds the batch to one bucket per connector and minute and one per connector and hour
(``HealthBucket``: sends, successes, a fixed histogram of send times) and to the connector's
``ConnectorHealth`` row (consecutive failures, last error), each as ONE multi-row upsert whose
update adds (``INSERT … ON CONFLICT DO UPDATE SET n = n + excluded.n``: the same SQL on PostgreSQL
and SQLite; ``bulk_create(update_conflicts=True)`` can only overwrite); on PostgreSQL the two go
as one prepared statement, the rows as JSON, or as part of the recorder's one statement a batch
(:func:`in_statement`). Concurrent recorders therefore both count, their rows in key order (no
deadlock between two that share connectors), and a rolled-back batch counts nothing.
``commands.health_figures`` reads at most 60 + 24 buckets per connector, whatever the number of
attempts: three queries for any page.

Guaranteed: the figures are those of the sends the recorder wrote (``ok`` true or false). Not
counted: a send whose worker died (``WorkerLost``, outcome unknown: it shows as a command waiting
for ``outlook-unknown``). p50/p95 are the upper bound of the histogram bin holding them
(``SEND_TIME_BOUNDS``), not exact times. Consecutive failures count in the order batches are
recorded: two dispatch processes recording interleaved sends may count one failure across a
success. An existing install (attempts but no summary) builds it with ``manage.py
health_backfill`` (:func:`backfill`: the last day, through :func:`record_rows`, as the recorder
does); old buckets go with ``manage.py prune`` (``commands.retention``).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from ankusa_site.core.prepared import execute_prepared
from ankusa_site.core.stock import stock
from commands.models.health import (
    BIN_FIELDS,
    BINS,
    HOUR,
    MINUTE,
    SEND_TIME_BOUNDS,
    ConnectorHealth,
    HealthBucket,
)

HOUR_BUCKETS, DAY_BUCKETS = 60, 24
ERROR_CHARS = 500  # the last error is a line to read, not the receiver's whole answer
UPSERT_ROWS = 400  # rows per statement: 21 parameters each stays under SQLite's 32,766


# --- writing ----------------------------------------------------------------------------------


def record(sent: Iterable) -> None:
    """Add the recorder's finished sends (``commands.dispatch.sends.Sent``) to the summary: call inside
    the transaction that writes their attempt rows."""
    record_rows(_send_rows(sent))


def in_statement(sent: Iterable) -> list[tuple[str, list]]:
    """:func:`record` of ``sent`` for the caller's own statement: the two upserts as ``(sql,
    params)``, each a data-modifying statement for the caller's ``WITH`` (none when ``sent`` is
    empty). PostgreSQL's SQL, for the recorder's one statement a batch, which is made only where
    :func:`record` writes these upserts (not on SQLite or under ``ANKUSA_STOCK_DJANGO``'s ``sql``)."""
    _, bucket_rows, run_rows = _summary(_send_rows(sent))
    if not run_rows:
        return []
    buckets, runs = _json_rows(bucket_rows, run_rows)
    return [(_BUCKET_UPSERT_POSTGRESQL, [buckets]), (_RUN_UPSERT_POSTGRESQL, [runs])]


def _send_rows(sent: Iterable):
    return (
        (
            one.command.connector_id,
            one.started,
            one.finished,
            one.outcome.ok,
            one.outcome.error_class,
            "" if one.outcome.ok else one.outcome.detail,
        )
        for one in sent
    )


def floor(moment: datetime, span: int) -> datetime:
    moment = moment.astimezone(UTC)
    if span == HOUR:
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(second=0, microsecond=0)


def send_bin(seconds: float) -> int:
    """The histogram bin of a send time: the first bound it does not exceed, else the last bin."""
    return bisect_left(SEND_TIME_BOUNDS, seconds)


@dataclass
class _Run:
    failures: int = 0  # since the batch's last success (or in all, if it had none)
    last_ok_at: datetime | None = None
    last_send_at: datetime | None = None
    error: tuple[str, str, datetime] | None = None


def record_rows(rows: Iterable[tuple], *, minutes_since: datetime | None = None) -> int:
    """Add sends ``(connector_id, started, finished, ok, error_class, error)``, in the order they
    were recorded, to the summary: one upsert for the buckets and one for the connectors.
    ``minutes_since``: minute buckets before it are left out (a backfill needs the last hour's).
    Returns how many sends it added."""
    if stock("sql"):  # ANKUSA_STOCK_DJANGO: the ORM's read-modify-write these upserts stand for
        counted, buckets, runs = _summed(rows, minutes_since)
        if runs:
            _orm_buckets(buckets)
            _orm_runs(runs)
        return counted
    counted, bucket_rows, run_rows = _summary(rows, minutes_since)
    if not run_rows:
        return 0
    if connection.vendor == "postgresql":
        # Both upserts as one prepared statement, whatever the batch's size: the rows go as two JSON
        # parameters the server unpacks into the tables' own row types (as intake's write), so the
        # text is the same for every batch (planned once a connection) and the driver quotes two
        # strings instead of 21 values a row. The buckets' upsert is a data-modifying WITH of the
        # runs', which PostgreSQL runs to completion whether the rest reads it or not.
        execute_prepared(connection, _ONE_UPSERT_POSTGRESQL, _json_rows(bucket_rows, run_rows))
        return counted
    with connection.cursor() as cursor:
        for sql, table_rows in ((_BUCKET_UPSERT, bucket_rows), (_RUN_UPSERT, run_rows)):
            for i in range(0, len(table_rows), UPSERT_ROWS):
                cursor.execute(*_upsert(sql, table_rows[i : i + UPSERT_ROWS]))
    return counted


def _summed(
    rows: Iterable[tuple], minutes_since: datetime | None = None
) -> tuple[int, dict, dict[int, _Run]]:
    """How many sends ``rows`` holds, their counts by bucket, and their runs by connector."""
    counted = 0
    buckets: dict[tuple[int, int, datetime], list[int]] = {}
    runs: dict[int, _Run] = {}
    for connector_id, started, finished, ok, error_class, error in rows:
        counted += 1
        where = send_bin((finished - started).total_seconds())
        for span in (MINUTE, HOUR):
            start = floor(finished, span)
            if span == MINUTE and minutes_since is not None and start < minutes_since:
                continue
            counts = buckets.setdefault((connector_id, span, start), [0] * (2 + BINS))
            counts[0] += 1
            counts[1] += 1 if ok else 0
            counts[2 + where] += 1
        run = runs.setdefault(connector_id, _Run())
        run.last_send_at = max(run.last_send_at or finished, finished)
        if ok:
            run.failures, run.last_ok_at = 0, max(run.last_ok_at or finished, finished)
        else:
            run.failures += 1
            if run.error is None or finished >= run.error[2]:
                run.error = (error_class or "", (error or "")[:ERROR_CHARS], finished)
    # In key order, whichever way they are written: concurrent recorders then lock the rows they
    # share in the same order, not in a deadlock.
    return counted, dict(sorted(buckets.items())), dict(sorted(runs.items()))


def _summary(rows: Iterable[tuple], minutes_since: datetime | None = None) -> tuple[int, list, list]:
    """:func:`_summed` as the upserts' rows on this connection: ``(count, bucket rows, run rows)``."""
    counted, buckets, runs = _summed(rows, minutes_since)
    # PostgreSQL reads the rows as JSON (ISO times); SQLite takes them as parameters.
    stamp = (
        datetime.isoformat if connection.vendor == "postgresql" else connection.ops.adapt_datetimefield_value
    )
    bucket_rows = [[cid, span, stamp(start), *counts] for (cid, span, start), counts in buckets.items()]
    run_rows = [
        [cid, run.failures, *(run.error[:2] if run.error else ("", "")),
         stamp(run.error[2]) if run.error else None, stamp(run.last_ok_at) if run.last_ok_at else None,
         stamp(run.last_send_at)]
        for cid, run in runs.items()
    ]  # fmt: skip
    return counted, bucket_rows, run_rows


def _json_rows(bucket_rows: list, run_rows: list) -> list[str]:
    """PostgreSQL: the buckets' and the runs' rows as the two JSON parameters of their upserts."""
    return [
        json.dumps([dict(zip(columns, row, strict=True)) for row in rows])
        for columns, rows in ((_BUCKET_COLUMNS, bucket_rows), (_RUN_COLUMNS, run_rows))
    ]


def _upsert(sql: str, rows: list[list]) -> tuple[str, list]:
    """``sql`` (an upsert with ``{rows}``) for ``rows`` as ``VALUES``, and its parameters."""
    marks = "(" + ", ".join(["%s"] * len(rows[0])) + ")"
    values = "VALUES " + ", ".join([marks] * len(rows))
    return sql.format(rows=values), [value for row in rows for value in row]


def _from_json(table: str, columns: tuple[str, ...]) -> str:
    """PostgreSQL: the rows of a JSON parameter (objects by column) as ``table``'s row type."""
    return f"SELECT {', '.join(columns)} FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb)"


_BT = HealthBucket._meta.db_table
_BUCKET_COLUMNS = ("connector_id", "span", "start", "sends", "ok", *BIN_FIELDS)
_BUCKET_UPSERT = (
    f"INSERT INTO {_BT} AS b ({', '.join(_BUCKET_COLUMNS)}) {{rows}} "
    "ON CONFLICT (connector_id, span, start) DO UPDATE SET "
    + ", ".join(f"{name} = b.{name} + excluded.{name}" for name in ("sends", "ok", *BIN_FIELDS))
)
_HT = ConnectorHealth._meta.db_table
# A batch with a success restarts the run at its failures after that success; one without adds
# to it. The last error and success are the newer of the stored and the batch's.
_NEWER_ERROR = "excluded.last_error_at IS NOT NULL AND (h.last_error_at IS NULL OR excluded.last_error_at >= h.last_error_at)"
_RUN_COLUMNS = (
    "connector_id",
    "consecutive_failures",
    "last_error_class",
    "last_error",
    "last_error_at",
    "last_ok_at",
    "last_send_at",
)
_RUN_UPSERT = (
    f"INSERT INTO {_HT} AS h ({', '.join(_RUN_COLUMNS)}) {{rows}} ON CONFLICT (connector_id) DO UPDATE SET "
    f"consecutive_failures = CASE WHEN excluded.last_ok_at IS NOT NULL THEN excluded.consecutive_failures "
    f"ELSE h.consecutive_failures + excluded.consecutive_failures END, "
    + ", ".join(
        f"{name} = CASE WHEN {_NEWER_ERROR} THEN excluded.{name} ELSE h.{name} END"
        for name in ("last_error_class", "last_error", "last_error_at")
    )
    + ", last_ok_at = CASE WHEN excluded.last_ok_at IS NULL OR (h.last_ok_at IS NOT NULL AND "
    "h.last_ok_at > excluded.last_ok_at) THEN h.last_ok_at ELSE excluded.last_ok_at END"
    ", last_send_at = CASE WHEN h.last_send_at > excluded.last_send_at THEN h.last_send_at "
    "ELSE excluded.last_send_at END"
)


_BUCKET_UPSERT_POSTGRESQL = _BUCKET_UPSERT.format(rows=_from_json(_BT, _BUCKET_COLUMNS))
_RUN_UPSERT_POSTGRESQL = _RUN_UPSERT.format(rows=_from_json(_HT, _RUN_COLUMNS))
_ONE_UPSERT_POSTGRESQL = f"WITH buckets AS ({_BUCKET_UPSERT_POSTGRESQL}) {_RUN_UPSERT_POSTGRESQL}"


def _orm_buckets(buckets: dict) -> None:
    for (cid, span, start), counts in buckets.items():
        names = ("sends", "ok", *BIN_FIELDS)
        adds = {name: F(name) + n for name, n in zip(names, counts, strict=True) if n}
        key = {"connector_id": cid, "span": span, "start": start}
        if HealthBucket.objects.filter(**key).update(**adds):
            continue
        try:
            with transaction.atomic():
                HealthBucket.objects.create(**key, **dict(zip(names, counts, strict=True)))
        except IntegrityError:  # another recorder created it meanwhile: add to it
            HealthBucket.objects.filter(**key).update(**adds)


def _orm_runs(runs: dict[int, _Run]) -> None:
    for cid, run in runs.items():
        ConnectorHealth.objects.get_or_create(connector_id=cid)
        row = ConnectorHealth.objects.select_for_update().get(connector_id=cid)
        row.consecutive_failures = run.failures + (0 if run.last_ok_at else row.consecutive_failures)
        if run.error and (row.last_error_at is None or run.error[2] >= row.last_error_at):
            row.last_error_class, row.last_error, row.last_error_at = run.error
        if run.last_ok_at and (row.last_ok_at is None or run.last_ok_at >= row.last_ok_at):
            row.last_ok_at = run.last_ok_at
        if run.last_send_at and (row.last_send_at is None or run.last_send_at > row.last_send_at):
            row.last_send_at = run.last_send_at
        row.save()


def windows(now: datetime) -> tuple[datetime, datetime]:
    """The first minute bucket of the last hour and the first hour bucket of the last day."""
    return (
        floor(now, MINUTE) - timedelta(minutes=HOUR_BUCKETS - 1),
        floor(now, HOUR) - timedelta(hours=DAY_BUCKETS - 1),
    )


# --- building and pruning ------------------------------------------------------------------------


BACKFILL_CHUNK = 10_000


def backfill(now: datetime | None = None, *, chunk: int = BACKFILL_CHUNK) -> int:
    """Build the summary again from the attempts of the last day (an install that has attempts
    but no summary, or one restored from a backup): replaces what is there, in one transaction,
    through :func:`record_rows` — the recorder's own aggregation. Returns the sends counted.
    Run it with the dispatch loop stopped: sends recorded while it runs may be counted twice.
    Consecutive failures count only that day's attempts."""
    from commands.models import Attempt

    now = now or timezone.now()
    minute_from, hour_from = windows(now)
    attempts = (
        Attempt.objects.filter(finished_at__gte=hour_from, finished_at__lte=now, ok__isnull=False)
        .order_by("finished_at", "id")
        .values_list(
            "command__connector_id", "started_at", "finished_at", "ok", "error_class", "error_message"
        )
    )
    with transaction.atomic():
        HealthBucket.objects.all().delete()
        ConnectorHealth.objects.all().delete()
        # One pass, one write: the day's buckets (at most 84 a connector) are summed in memory.
        return record_rows(attempts.iterator(chunk_size=chunk), minutes_since=minute_from)


# Buckets are read for an hour (minutes) and a day (hours); retention keeps a margin past that.
KEEP_MINUTES = timedelta(hours=2)
KEEP_HOURS = timedelta(days=2)


def old_buckets(now: datetime):
    """The buckets no window reads any more (``commands.retention``)."""
    return HealthBucket.objects.filter(
        Q(span=MINUTE, start__lt=now - KEEP_MINUTES) | Q(span=HOUR, start__lt=now - KEEP_HOURS)
    )
