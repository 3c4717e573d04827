"""Waking a waiting consumer (``queues.wake``): a committed enqueue wakes it within milliseconds on
PostgreSQL (LISTEN/NOTIFY) and on Redis (the wake list); a rollback does not; SQLite polls. On
PostgreSQL a commit notifies only while a consumer sleeps, and no wake is lost for it."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from django.conf import settings
from django.db import connection, transaction

from queues import wake
from queues.backends.database import DatabaseFIFO
from queues.backends.redis import RedisFIFO
from tests.servers import wait_for
from tests.services import database_url

# A wake must come far inside the dispatch poll (1 s); generous for a loaded machine.
WAKE_BOUND_S = 0.5


def listeners() -> int:
    """This test database's wake listeners (another run's on the same server are not ours)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'ankusa-wake' AND datname = current_database()"
        )
        return cursor.fetchone()[0]


class Waiter:
    """A thread waiting on ``queue.wait_for_work(timeout)``; ``result`` is (woken, seconds waited)."""

    def __init__(self, queue, timeout: float = 5.0):
        self.result: tuple[bool, float] | None = None
        self.thread = threading.Thread(target=self._run, args=(queue, timeout), daemon=True)
        self.thread.start()
        time.sleep(0.05)  # inside its wait before the test goes on

    def _run(self, queue, timeout):
        started = time.monotonic()
        try:
            woken = queue.wait_for_work(timeout)
            self.result = (woken, time.monotonic() - started)
        finally:
            connection.close()  # with its session goes the wake gate it may hold

    def join(self) -> tuple[bool, float]:
        self.thread.join(10)
        assert self.result is not None
        return self.result


@pytest.fixture
def listening():
    """The process's PostgreSQL listener, connected before the test enqueues; stopped after."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL-only: LISTEN/NOTIFY")
    listener = wake.listener("default")
    assert listener.connected.wait(10)
    yield listener
    wake.close_listeners()


@pytest.fixture(params=["postgresql", "redis"])
def waking_queue(request, transactional_db):
    """A queue whose backend wakes: the database one on PostgreSQL, and Redis."""
    if request.param == "redis":
        request.getfixturevalue("django_redis")
        queue = RedisFIFO("jobs")
        queue.redis.delete(queue.wake_key)
        return queue
    request.getfixturevalue("listening")
    queue = DatabaseFIFO("jobs")
    queue.wait_for_work(0)  # an earlier test's wake is not this test's
    return queue


def test_a_committed_enqueue_wakes_a_waiting_consumer_within_milliseconds(waking_queue):
    waiter = Waiter(waking_queue)
    enqueued = time.monotonic()
    with transaction.atomic():
        transaction.on_commit(lambda: waking_queue.enqueue({"n": 1}))  # the Redis queue's way
        if waking_queue.backend == "database":
            waking_queue.enqueue({"n": 1})  # in the transaction: the NOTIFY goes with its commit
    woken, _ = waiter.join()
    assert woken
    assert time.monotonic() - enqueued < WAKE_BOUND_S
    assert waking_queue.claim(2)


def test_a_wake_by_hand_wakes_a_waiting_consumer(waking_queue):
    waiter = Waiter(waking_queue)
    waking_queue.wake()
    woken, waited = waiter.join()
    assert woken and waited < WAKE_BOUND_S


@pytest.mark.parametrize("how", ["enqueue", "wake"])
def test_a_rolled_back_transaction_wakes_no_one(waking_queue, how):
    waiter = Waiter(waking_queue, timeout=0.5)
    with pytest.raises(RuntimeError), transaction.atomic():
        if how == "wake":
            waking_queue.wake()
        elif waking_queue.backend == "database":
            waking_queue.enqueue({"n": 1})
        else:
            transaction.on_commit(lambda: waking_queue.enqueue({"n": 1}))
        raise RuntimeError("rolled back")
    assert waiter.join()[0] is False
    assert waking_queue.length() == 0


def test_the_wake_of_a_transaction_arrives_at_its_commit_not_before(waking_queue):
    with transaction.atomic():
        waking_queue.wake()
        if waking_queue.backend == "database":
            waking_queue.enqueue({"n": 1})
        assert waking_queue.wait_for_work(0.3) is False  # not committed yet
    assert waking_queue.wait_for_work(2.0) is True


def test_a_requeued_item_wakes_a_waiting_consumer(waking_queue):
    waking_queue.enqueue({"n": 1})
    (item,) = waking_queue.claim(1)
    waking_queue.wait_for_work(0.2)  # the enqueue's own wake, taken
    waiter = Waiter(waking_queue)
    waking_queue.requeue(item, error="try again")
    woken, waited = waiter.join()
    assert woken and waited < WAKE_BOUND_S


def test_a_wake_for_another_queue_does_not_wake_this_one(waking_queue):
    other = RedisFIFO("others") if waking_queue.backend == "redis" else DatabaseFIFO("others")
    waiter = Waiter(waking_queue, timeout=0.5)
    other.wake()
    assert waiter.join()[0] is False


def test_one_listening_connection_serves_every_queue_and_thread_of_a_process(listening, transactional_db):
    queues = [DatabaseFIFO(name) for name in ("a", "b", "c")]
    waiters = [Waiter(queue) for queue in queues for _ in range(2)]
    for queue in queues:
        queue.wake()
    assert all(waiter.join()[0] for waiter in waiters[::2])  # one of each queue's waiters at least
    assert listeners() == 1


def test_a_listener_that_lost_its_connection_reconnects_and_wakes_its_waiters(listening, transactional_db):
    queue = DatabaseFIFO("jobs")
    queue.wait_for_work(0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'ankusa-wake' AND datname = current_database()"
        )
    # Back, and it says so: a wake sent while it was away is caught by this one (or by the poll).
    assert queue.wait_for_work(10) is True
    assert listening.connected.wait(10)
    waiter = Waiter(queue)
    queue.wake()
    assert waiter.join()[0] is True


def test_on_sqlite_a_waiting_consumer_sleeps_out_its_timeout(db):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite-only: it polls")
    queue = DatabaseFIFO("jobs")
    queue.wake()  # nothing to wake: a no-op
    started = time.monotonic()
    assert queue.wait_for_work(0.2) is False
    assert time.monotonic() - started >= 0.2


def test_waiting_until_a_stop_returns_within_a_slice():
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    assert wake.wait_until(lambda timeout: time.sleep(timeout) or False, stop, 30, slice_s=0.05) is False
    assert time.monotonic() - started < 1.0


def test_a_wait_that_fails_sleeps_its_slice_and_the_poll_goes_on():
    calls = []

    def broken(timeout):
        calls.append(timeout)
        raise ConnectionError("Redis went away")

    assert wake.wait_until(broken, threading.Event(), 0.2, slice_s=0.05) is False
    assert len(calls) >= 2


# --- PostgreSQL: a commit notifies only while a consumer sleeps (migration queues.0004) ---------------

GATE = 1634626421


def raw_listener() -> psycopg.Connection:
    """A LISTENing connection of the test's own, outside the process's listener: it sees every
    notification sent, whoever it wakes."""
    conn = psycopg.connect(database_url(settings.DATABASES["default"]), autocommit=True)
    conn.execute(f"LISTEN {wake.CHANNEL}")
    return conn


def notified(conn: psycopg.Connection, seconds: float = 0.3) -> list[str]:
    return [notify.payload for notify in conn.notifies(timeout=seconds)]


@pytest.fixture
def nobody_sleeps(listening, transactional_db):
    """No session of this test database holds the wake gate (an earlier test's thread may have)."""
    listening.gate.close()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [GATE],
        )
    return listening.gate


def test_a_commit_that_queues_sends_no_notification_while_no_consumer_sleeps(nobody_sleeps):
    watcher = raw_listener()
    queue = DatabaseFIFO("jobs")
    queue.enqueue({"n": 1})
    with transaction.atomic():
        queue.enqueue({"n": 2}, {"n": 3})
    assert notified(watcher) == []
    assert len(queue.claim(3)) == 3
    waiter = Waiter(queue)  # now one sleeps: the next commit notifies, and wakes it
    queue.enqueue({"n": 4})
    assert waiter.join()[0] is True
    assert notified(watcher) == ["jobs"]


def test_a_consumer_about_to_sleep_finds_work_that_was_queued_without_a_notification(nobody_sleeps):
    queue = DatabaseFIFO("jobs")
    queue.enqueue({"n": 1})  # nobody sleeps: no notification
    started = time.monotonic()
    assert queue.wait_for_work(5) is True  # its look before it sleeps finds the item
    assert time.monotonic() - started < WAKE_BOUND_S
    assert not nobody_sleeps.asleep()  # it found work: it is awake
    assert [item.payload for item in queue.claim(1)] == [{"n": 1}]


def test_a_consumer_holds_the_gate_while_it_sleeps_and_lets_go_when_it_claims(nobody_sleeps):
    watcher = raw_listener()
    queue = DatabaseFIFO("jobs")
    assert queue.wait_for_work(0.05) is False
    assert nobody_sleeps.asleep()  # between two slices of its wait it still sleeps
    thread = threading.Thread(target=lambda: (queue.enqueue({"n": 1}), connection.close()))
    thread.start()
    thread.join()
    assert notified(watcher) == ["jobs"]
    assert queue.wait_for_work(1) is True
    queue.claim(1)
    assert not nobody_sleeps.asleep()
    assert wait_for(lambda: not nobody_sleeps.held, timeout=5)  # the gate's thread let go
    queue.enqueue({"n": 2})  # it claims again before it sleeps: nobody is told
    assert notified(watcher) == []


def test_a_commit_that_holds_its_stripe_does_not_keep_a_consumer_from_its_poll(nobody_sleeps):
    queue = DatabaseFIFO("jobs")
    with psycopg.connect(database_url(settings.DATABASES["default"])) as holder:
        for stripe in range(32):  # every stripe, as a commit in progress holds its own
            holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", [GATE, stripe])
        started = time.monotonic()
        assert queue.wait_for_work(0.2) is False  # not gated, it waited its slice like a poll
        assert time.monotonic() - started < 1.0
        assert not nobody_sleeps.asleep()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
                " WHERE l.locktype = 'advisory' AND a.application_name = 'ankusa-wake-gate'"
                " AND a.datname = current_database()"  # another run's gates on this server are not ours
            )
            assert cursor.fetchone()[0] == 0  # the stripes it took before the timeout were let go
    queue.enqueue({"n": 1})
    assert queue.wait_for_work(1) is True


PRODUCER = """
import sys
import django
django.setup()
from queues.backends.database import DatabaseFIFO
from tests.queues.test_wake import produce_in_bursts
produce_in_bursts(DatabaseFIFO("jobs"), sys.argv[1])
"""
BURSTS, PER_BURST = 3, 12


def produce_in_bursts(queue, name: str) -> None:
    """Every producer queues in the same 0.2 s of each wall-clock second and is quiet for the rest:
    a wake lost at the end of a burst waits out the quiet 0.8 s, beyond the wake bound."""
    for burst in range(BURSTS):
        time.sleep(1 - time.time() % 1)
        for n in range(PER_BURST):
            queue.enqueue({"producer": name, "n": burst * PER_BURST + n})
            time.sleep(random.uniform(0, 0.2 / PER_BURST))


def test_no_wake_is_lost_between_a_drain_and_its_sleep_with_producers_in_threads_and_processes(
    nobody_sleeps, service_env
):
    """Producers in three threads and two processes queue in bursts; one consumer claims until the
    queue is empty, lingers (a drain's tail) and sleeps with a 10 s wait (its poll, far off). Every
    item is claimed once, within the wake bound: what committed while it lingered, notifying
    nobody, its look before it sleeps finds."""
    threads_n, processes_n = 3, 2
    total = BURSTS * PER_BURST * (threads_n + processes_n)
    queue = DatabaseFIFO("jobs")
    latencies: dict[tuple, float] = {}

    def consume() -> None:
        try:
            while len(latencies) < total:
                items = queue.claim(50)
                now = time.time()
                for item in items:
                    key = (item.payload["producer"], item.payload["n"])
                    assert key not in latencies
                    latencies[key] = now - item.enqueued_at.timestamp()
                queue.done(*items)
                if not items:
                    time.sleep(0.005)
                    queue.wait_for_work(10)
        finally:
            connection.close()

    def produce(name: str) -> None:
        try:
            produce_in_bursts(queue, name)
        finally:
            connection.close()

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    processes = [
        subprocess.Popen([sys.executable, "-c", PRODUCER, f"p{n}"], env=service_env)
        for n in range(processes_n)
    ]
    producers = [threading.Thread(target=produce, args=(f"t{n}",)) for n in range(threads_n)]
    for thread in producers:
        thread.start()
    for thread in producers:
        thread.join()
    for process in processes:
        assert process.wait(60) == 0
    consumer.join(30)
    assert len(latencies) == total
    assert max(latencies.values()) < WAKE_BOUND_S
