"""Waking a waiting consumer (``queues.wake``): a committed enqueue wakes it within milliseconds on
PostgreSQL (LISTEN/NOTIFY) and on Redis (the wake list); a rollback does not; SQLite polls."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from queues import wake
from queues.backends.database import DatabaseFIFO
from queues.backends.redis import RedisFIFO

# A wake must come far inside the dispatch poll (1 s); generous for a loaded machine.
WAKE_BOUND_S = 0.5


class Waiter:
    """A thread waiting on ``queue.wait_for_work(timeout)``; ``result`` is (woken, seconds waited)."""

    def __init__(self, queue, timeout: float = 5.0):
        self.result: tuple[bool, float] | None = None
        self.thread = threading.Thread(target=self._run, args=(queue, timeout), daemon=True)
        self.thread.start()
        time.sleep(0.05)  # inside its wait before the test goes on

    def _run(self, queue, timeout):
        started = time.monotonic()
        woken = queue.wait_for_work(timeout)
        self.result = (woken, time.monotonic() - started)

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
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ankusa-wake'")
        assert cursor.fetchone()[0] == 1


def test_a_listener_that_lost_its_connection_reconnects_and_wakes_its_waiters(listening, transactional_db):
    queue = DatabaseFIFO("jobs")
    queue.wait_for_work(0)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'ankusa-wake'"
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
