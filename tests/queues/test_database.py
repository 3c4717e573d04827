"""What only the database backend promises: it joins the caller's transaction, its claim is one
statement served by one partial index, and its done finds rows by primary key."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queues.backends import database
from queues.backends.database import (
    CLAIM_SQL_POSTGRESQL,
    CLAIM_SQL_POSTGRESQL_ASYNC_COMMIT,
    DONE_SQL,
    ENQUEUE_SQL_POSTGRESQL,
    DatabaseFIFO,
)
from queues.models import QueueItem
from tests.private_services import MIGRATED


class Rollback(Exception):
    pass


def test_enqueue_inside_a_rolled_back_transaction_leaves_no_item(db):
    queue = DatabaseFIFO("commands")
    with pytest.raises(Rollback), transaction.atomic():
        queue.enqueue({"command": 1})
        assert queue.length() == 1  # visible inside the caller's own transaction
        raise Rollback
    assert queue.length() == 0
    assert not QueueItem.objects.exists()


def test_enqueue_inside_a_committed_transaction_commits_with_it(db):
    queue = DatabaseFIFO("commands")
    with transaction.atomic():
        (pk,) = queue.enqueue({"command": 1})
    assert [item.id for item in queue.claim()] == [pk]


def test_enqueue_does_not_commit_on_its_own_inside_a_transaction(transactional_db):
    """Another connection sees nothing until the caller commits."""
    queue = DatabaseFIFO("commands")
    seen = []

    def look():
        seen.append(QueueItem.objects.filter(queue="commands").count())
        connection.close()

    with transaction.atomic():
        queue.enqueue({"command": 1})
        if connection.vendor == "postgresql":  # SQLite's writer holds the lock; a reader would wait
            reader = threading.Thread(target=look)
            reader.start()
            reader.join(10)
            assert seen == [0]
    assert queue.length() == 1


def test_a_json_null_payload_is_stored_as_json_not_sql_null(db):
    DatabaseFIFO("jobs").enqueue(None)
    assert QueueItem.objects.filter(payload__isnull=True).count() == 0
    assert QueueItem.objects.get().payload is None


def test_done_deletes_the_row(db):
    queue = DatabaseFIFO("jobs")
    queue.enqueue("a")
    queue.done(*queue.claim())
    assert not QueueItem.objects.exists()


def test_postgresql_claim_is_one_statement_on_the_main_order_index(postgres):
    queue = DatabaseFIFO("jobs")
    queue.enqueue(*range(50))
    DatabaseFIFO("other").enqueue(*range(50))
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")  # a 100-row table would otherwise be scanned
        cursor.execute("EXPLAIN " + CLAIM_SQL_POSTGRESQL, ["jobs", 10, queue.clock()])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("RESET enable_seqscan")
    assert "queueitem_main_order" in plan
    assert "LockRows" in plan


@pytest.mark.fast_path  # the stock ORM's claim commits as Django does
def test_postgresql_claim_commits_asynchronously_by_itself_but_never_inside_a_transaction(
    postgres, transactional_db
):
    queue = DatabaseFIFO("jobs")
    queue.enqueue("a", "b")
    with CaptureQueriesContext(connection) as by_itself:
        assert len(queue.claim()) == 1
    assert "synchronous_commit" in by_itself.captured_queries[-1]["sql"]
    with transaction.atomic():
        with CaptureQueriesContext(connection) as inside:
            assert len(queue.claim()) == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('synchronous_commit')")
            assert cursor.fetchone()[0] == "on"  # the caller's writes commit as it asked
    assert "synchronous_commit" not in inside.captured_queries[-1]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"  # the session's own setting, untouched


@pytest.mark.slow
def test_an_asynchronous_claim_returns_before_its_commit_is_on_disk_and_a_synchronous_one_after(
    migrated_postgres,
):
    # On a server of the test's own, idle but for this connection: nothing else moves the log.
    with psycopg.connect(migrated_postgres.url(), autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET autovacuum = off")
        admin.execute("SELECT pg_reload_conf()")
    with psycopg.connect(migrated_postgres.url(MIGRATED), autocommit=True) as db:
        db.execute(
            "INSERT INTO queues_queueitem (queue, state, position, payload, enqueued_at, claims,"
            " requeue_count, fail_count, last_error)"
            " SELECT 'jobs', 'main', n, '1', now(), 0, 0, 0, '' FROM generate_series(1, 10) AS n"
        )

        def unflushed_after(claim: str) -> bool:
            assert len(db.execute(claim, ["jobs", 1, timezone.now()]).fetchall()) == 1
            inserted, flushed = db.execute(
                "SELECT pg_current_wal_insert_lsn(), pg_current_wal_flush_lsn()"
            ).fetchone()
            return flushed < inserted

        # Counted over five claims each: the server's own records (a snapshot of running
        # transactions every 15 s) may land unflushed once, and the log's writer, which flushes
        # every 200 ms, may have flushed an asynchronous claim before the look, once.
        assert sum(unflushed_after(CLAIM_SQL_POSTGRESQL) for _ in range(5)) <= 1
        assert sum(unflushed_after(CLAIM_SQL_POSTGRESQL_ASYNC_COMMIT) for _ in range(5)) >= 4


def test_postgresql_done_finds_rows_by_primary_key_not_by_scanning_busy(postgres):
    queue = DatabaseFIFO("jobs")
    queue.enqueue(*range(3000))
    queue.claim(2970)  # parked in busy
    items = queue.claim(30)
    tokens = [(item.id, item.claims) for item in items]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE queues_queueitem")
        cursor.execute(
            "EXPLAIN " + DONE_SQL.format(ids=", ".join(["%s"] * 30), tokens=", ".join(["(%s, %s)"] * 30)),
            [pk for pk, _ in tokens] + ["jobs"] + [value for token in tokens for value in token],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "queues_queueitem_pkey" in plan
    assert "queueitem_busy_claimed" not in plan
    assert queue.done(*items) == 30


def test_postgresql_tail_positions_come_from_a_sequence_not_a_read_of_the_tail(postgres):
    jobs, other = DatabaseFIFO("jobs"), DatabaseFIFO("other")
    jobs.enqueue("a", "b")
    other.enqueue("x")
    jobs.requeue(*jobs.claim())  # "a" to the tail of jobs
    jobs.enqueue("c")
    assert [item.payload for item in jobs.claim(3)] == ["b", "a", "c"]
    a, b, x, c = QueueItem.objects.order_by("id").values_list("position", flat=True)
    assert b < x < a < c  # one sequence for every tail placement, whatever the queue
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + ENQUEUE_SQL_POSTGRESQL, ["jobs", jobs.clock(), '["d"]'])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "InitPlan" not in plan and "queueitem_main_order" not in plan


def test_the_sequence_starts_after_positions_given_before_it_existed(postgres, transactional_db):
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("queues")
    executor.migrate([("queues", "0001_initial")])
    try:
        QueueItem.objects.create(queue="jobs", position=10_000, payload="old", enqueued_at=timezone.now())
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
    queue = DatabaseFIFO("jobs")
    queue.enqueue("new")
    assert [item.payload for item in queue.claim(2)] == ["old", "new"]


def test_a_requeue_that_finds_nothing_does_not_ask_for_positions(db, django_assert_num_queries):
    queue = DatabaseFIFO("jobs")
    queue.enqueue("a")
    with django_assert_num_queries(1):  # the rows to move, none: no tail read or sequence draw
        assert queue.requeue_ids([12345]) == 0
    with django_assert_num_queries(1):
        assert queue.requeue_failed() == 0


@pytest.mark.django_db
def test_under_stock_sql_the_queue_runs_the_orms_statements_not_its_own(settings):
    """``ANKUSA_STOCK_DJANGO``'s ``sql`` layer: enqueue, claim and done go through the ORM
    (``queues.backends.database_stock``), with the same results as the hand-written statements."""
    from django.test.utils import CaptureQueriesContext

    settings.ANKUSA_STOCK_DJANGO = frozenset({"sql"})
    queue = DatabaseFIFO("stocked")
    with CaptureQueriesContext(connection) as captured:
        queue.enqueue({"n": 1}, {"n": 2}, None)
        first, second = queue.claim(2)
        assert queue.done(first, second.id) == 2
    hand_written = ("jsonb_array_elements", "ctid", "unnest(", "RETURNING id, position")
    assert not [q["sql"] for q in captured.captured_queries if any(mark in q["sql"] for mark in hand_written)]
    assert [item.payload for item in queue.claim(5)] == [None]


def seq_scans_of_the_queue() -> int:
    """Sequential scans of the queue table begun in this transaction (a rescan counts again)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_get_xact_numscans('queues_queueitem'::regclass)")
        return cursor.fetchone()[0]


@pytest.fixture
def replans(monkeypatch):
    """The process's record of backlogs seen, fresh, on a clock the test moves."""
    moments = [1000.0]
    monkeypatch.setattr(database, "REPLANS", database._Replans())
    monkeypatch.setattr(database.REPLANS, "clock", lambda: moments[0])
    return moments


@pytest.mark.fast_path  # the stock ORM's claim and done count scans of their own
def test_a_consumer_whose_plans_were_made_on_an_empty_queue_drains_a_backlog_by_key(postgres, replans):
    """PostgreSQL keeps a prepared statement's plan made while the table was a page (a scan of the
    whole table, cheaper then) for every later row: a sudden backlog would cost a scan per claim
    and per item. A full claim says a backlog is there, and the consumer's statements are planned
    again for the table as it is."""
    queue = DatabaseFIFO("commands")
    for n in range(12):  # past psycopg's and PostgreSQL's thresholds: the statements' plans are kept
        queue.enqueue({"n": n})
        queue.done(*queue.claim(1))
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO queues_queueitem (queue, state, position, payload, enqueued_at, claims,"
            " requeue_count, fail_count, last_error) SELECT 'commands', 'main', 100 + g,"
            " jsonb_build_object('n', g), now(), 0, 0, 0, '' FROM generate_series(1, 5000) AS g"
        )
    before = seq_scans_of_the_queue()
    drained = 0
    while items := queue.claim(100):
        drained += queue.done(*items)
    assert drained == 5000
    assert seq_scans_of_the_queue() - before < 10  # not one (or more) a claim or an item


def test_a_consumer_drops_its_plans_at_most_once_in_a_while_however_many_full_claims(postgres, replans):
    queue = DatabaseFIFO("commands")
    queue.enqueue(*range(40))
    with CaptureQueriesContext(connection) as first:
        for _ in range(4):
            queue.done(*queue.claim(5))  # full claims, one after another
    assert sum("DISCARD PLANS" in query["sql"] for query in first.captured_queries) == 1
    replans[0] += database.REPLAN_EVERY_S
    with CaptureQueriesContext(connection) as later:
        queue.done(*queue.claim(5))
        queue.done(*queue.claim(5))
    assert sum("DISCARD PLANS" in query["sql"] for query in later.captured_queries) == 1
