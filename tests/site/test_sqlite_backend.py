"""The site's SQLite backend (``ankusa_site.sqlite3``): a transaction waits for the write lock in
short steps of its own, as long as the connection's timeout, and fails as SQLite would after it;
the threads of one process take turns before that, and a turn ends with the transaction."""

from __future__ import annotations

import gc
import multiprocessing
import sqlite3
import threading
import time

import pytest
from django.db import connection, transaction
from django.db.utils import ConnectionHandler, OperationalError
from django.test.utils import CaptureQueriesContext

from ankusa_site.core.env import parse_database_url
from ankusa_site.sqlite3.base import DatabaseWrapper, _turn
from limits.models import Tenant


def wrapper(path, timeout_s: float) -> DatabaseWrapper:
    """A connection of the site's backend to the file ``path``, as ``DATABASE_URL`` would make it."""
    settings_dict = parse_database_url("DATABASE_URL", f"sqlite:///{path}", base_dir=path.parent)
    settings_dict["OPTIONS"]["timeout"] = timeout_s
    db = ConnectionHandler({"default": settings_dict})["default"]
    assert isinstance(db, DatabaseWrapper)
    return db


@pytest.fixture
def database(tmp_path, django_db_blocker):
    path = tmp_path / "db.sqlite3"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE t (n INTEGER)")
    made = []

    def connect(timeout_s: float = 5.0) -> DatabaseWrapper:
        made.append(wrapper(path, timeout_s))
        made[-1].ensure_connection()
        return made[-1]

    with django_db_blocker.unblock():
        yield path, connect
        for db in made:
            db.close()


def test_a_kept_connection_shrinks_the_write_ahead_log_after_a_burst(
    tmp_path, monkeypatch, django_db_blocker
):
    monkeypatch.setattr("ankusa_site.core.env.SQLITE_WAL_LIMIT_BYTES", 64 * 1024)
    path = tmp_path / "db.sqlite3"
    wal = tmp_path / "db.sqlite3-wal"
    with django_db_blocker.unblock():
        db = wrapper(path, 5.0)
        try:
            with db.cursor() as cursor:
                cursor.execute("CREATE TABLE t (s TEXT)")
                cursor.execute(
                    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 500)"
                    " INSERT INTO t SELECT hex(randomblob(2000)) FROM n"
                )
                burst = wal.stat().st_size
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                cursor.execute("INSERT INTO t VALUES ('after')")  # the log starts over, truncated
                after = wal.stat().st_size  # measured while open: the last close deletes the file
        finally:
            db.close()
    assert burst > 1024 * 1024
    assert after <= 64 * 1024


def hold_write_lock(path, seconds: float, ready) -> None:
    """In another process: take the write lock, tell ``ready``, keep it ``seconds``, commit."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO t VALUES (1)")
    ready.set()
    time.sleep(seconds)
    holder.execute("COMMIT")
    holder.close()


def begin(db: DatabaseWrapper) -> None:
    """What ``transaction.atomic()`` does first on a connection in autocommit."""
    db.set_autocommit(False, force_begin_transaction_with_broken_autocommit=True)


def end(db: DatabaseWrapper, *, commit: bool = True) -> None:
    """What ``transaction.atomic()`` does last."""
    db.commit() if commit else db.rollback()
    db.set_autocommit(True)


def busy_timeout_ms(db: DatabaseWrapper) -> int:
    return db.connection.execute("PRAGMA busy_timeout").fetchone()[0]


def test_a_transaction_waits_for_a_writer_in_another_process_then_begins(database):
    path, connect = database
    db = connect(timeout_s=5.0)
    ready = multiprocessing.Event()
    holder = multiprocessing.Process(target=hold_write_lock, args=(path, 0.3, ready))
    holder.start()
    try:
        assert ready.wait(10)
        statements = []
        db.connection.set_trace_callback(statements.append)
        started = time.monotonic()
        begin(db)
        waited = time.monotonic() - started
        db.connection.set_trace_callback(None)
        db.connection.execute("INSERT INTO t VALUES (2)")
        end(db)
    finally:
        holder.join(10)
    assert waited > 0.1  # it did wait for the holder, which kept the lock 0.3 s
    # Not in SQLite's busy handler (one BEGIN, sleeping up to 100 ms between its own tries) but in
    # short steps of its own: the handler off, BEGIN tried again and again, the handler back.
    assert statements[0] == "PRAGMA busy_timeout = 0"
    assert statements[-1] == "PRAGMA busy_timeout = 5000"
    assert set(statements[1:-1]) == {"BEGIN IMMEDIATE"} and len(statements) > 10
    assert [n for (n,) in db.connection.execute("SELECT n FROM t ORDER BY n")] == [1, 2]
    assert busy_timeout_ms(db) == 5000  # statements outside a transaction keep SQLite's handler


def test_a_transaction_that_never_gets_the_lock_fails_as_locked_after_the_timeout(database):
    path, connect = database
    db = connect(timeout_s=0.2)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(OperationalError, match="database is locked"):
            begin(db)
        assert time.monotonic() - started >= 0.2
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not db.connection.in_transaction
    assert busy_timeout_ms(db) == 200
    assert not _turn(str(path)).locked()  # the next writer of this process is not wedged


def test_threads_each_with_a_connection_all_write_and_none_is_refused(database):
    path, connect = database
    errors = []

    def write(n: int) -> None:
        db = wrapper(path, timeout_s=5.0)
        try:
            for _ in range(25):
                begin(db)
                db.connection.execute("INSERT INTO t VALUES (?)", (n,))
                end(db)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            db.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    with sqlite3.connect(path) as check:
        assert check.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 200


def test_threads_of_one_process_take_turns_instead_of_trying_sqlites_lock(database):
    path, connect = database
    first = connect()
    begin(first)
    statements = []

    def second_writer() -> None:
        second = wrapper(path, timeout_s=5.0)
        second.ensure_connection()
        second.connection.set_trace_callback(statements.append)
        begin(second)
        second.connection.execute("INSERT INTO t VALUES (2)")
        end(second)
        second.close()

    waiting = threading.Thread(target=second_writer)
    waiting.start()
    time.sleep(0.2)  # time for the second writer to come to its turn (if not, it finds none taken)
    first.connection.execute("INSERT INTO t VALUES (1)")
    end(first)
    waiting.join(10)
    # It waited for its turn, not on SQLite's lock: by its turn the first had committed.
    assert statements[:3] == ["PRAGMA busy_timeout = 0", "BEGIN IMMEDIATE", "PRAGMA busy_timeout = 5000"]
    assert [n for (n,) in first.connection.execute("SELECT n FROM t ORDER BY n")] == [1, 2]


@pytest.mark.parametrize("how", ["commit", "rollback", "close"])
def test_a_turn_ends_with_its_transaction_however_it_ends(database, how):
    path, connect = database
    db = connect()
    begin(db)
    assert _turn(str(path)).locked()
    if how == "close":
        db.close()
    else:
        end(db, commit=how == "commit")
    assert not _turn(str(path)).locked()


def test_a_writer_that_waits_past_its_timeout_for_its_turn_fails_as_locked(database):
    path, connect = database
    holder, waiter = connect(), connect(timeout_s=0.2)
    begin(holder)
    failed = []

    def wait_for_turn() -> None:
        try:
            waiter._start_transaction_under_autocommit()
        except OperationalError as exc:
            failed.append(str(exc))

    thread = threading.Thread(target=wait_for_turn)  # another thread: the turn is not reentrant
    thread.start()
    thread.join(10)
    end(holder)
    assert failed == ["database is locked"]
    assert not _turn(str(path)).locked()


def turn_is_free(path, answer) -> None:
    answer.put(not _turn(str(path)).locked())


def test_a_process_forked_while_a_thread_holds_a_turn_starts_with_its_turns_free(database):
    path, connect = database
    db = connect()
    begin(db)
    try:
        fork = multiprocessing.get_context("fork")
        answer = fork.Queue()
        child = fork.Process(target=turn_is_free, args=(path, answer))
        child.start()
        child.join(10)
        assert answer.get(timeout=10) is True
    finally:
        end(db)


def test_a_begin_refused_for_another_reason_than_the_lock_fails_at_once_and_frees_the_turn(database):
    path, connect = database
    db = connect()
    db.connection.execute("BEGIN")  # already in a transaction: SQLite refuses the next BEGIN outright
    statements = []
    db.connection.set_trace_callback(statements.append)
    with pytest.raises(OperationalError, match="within a transaction"):
        begin(db)
    assert statements == ["PRAGMA busy_timeout = 0", "BEGIN IMMEDIATE", "PRAGMA busy_timeout = 5000"]
    assert not _turn(str(path)).locked()


def test_a_connection_collected_inside_its_transaction_gives_its_turn_back(database):
    path, connect = database
    lost = wrapper(path, timeout_s=5.0)
    lost.ensure_connection()
    begin(lost)  # and never ended: its thread died inside atomic, say
    assert _turn(str(path)).locked()
    del lost
    gc.collect()
    assert not _turn(str(path)).locked()
    other = connect(timeout_s=1.0)
    begin(other)  # SQLite rolled the lost one back as its connection went: the lock is free too
    end(other)


def test_atomic_hands_the_turn_over_before_its_on_commit_hooks_write(transactional_db):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-only: DATABASE_URL names PostgreSQL in this run")
    name = connection.settings_dict["NAME"]
    seen = []

    def hook():
        seen.append(_turn(name).locked())
        with transaction.atomic():  # a hook that writes takes a turn of its own
            Tenant.objects.create(slug="hooked", name="Hooked")

    with transaction.atomic():
        assert _turn(name).locked()
        Tenant.objects.create(slug="acme", name="Acme")
        transaction.on_commit(hook)
    assert seen == [False]
    assert not _turn(name).locked()
    assert sorted(Tenant.objects.values_list("slug", flat=True)) == ["acme", "hooked"]


def test_the_begin_is_in_the_queries_django_captures_as_its_own_backends_is(database):
    path, connect = database
    db = connect()
    with CaptureQueriesContext(db) as captured:
        begin(db)
        end(db)
    assert [query["sql"] for query in captured.captured_queries] == ["BEGIN IMMEDIATE", "COMMIT"]
