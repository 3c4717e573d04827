"""Sends in flight are tasks on one event loop per process (``commands.dispatch.event_loop``): many at once
on a few database connections and threads, in ``manage.py dispatch`` and in a Celery worker alike;
a dispatch process killed with 1,000 in flight loses nothing and sends nothing twice."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest
from django.conf import settings
from django.db import connection, connections

from commands import tasks
from commands.dispatch import event_loop
from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.sends import WORKER_LOST
from commands.dispatch.sweep import sweep
from commands.lifecycle import QUEUE_NAME
from commands.models import Command, Connector
from commands.states import State
from queues.backends import get_queue
from tests.commands.sink import ReceiverProcess
from tests.servers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(transactional_db):
    q = get_queue(QUEUE_NAME)
    q.flush()
    return q


def slow_receiver(delay: float) -> ReceiverProcess:
    """The slow-receivers benchmark's receiver (asyncio, its own process): answers 200 after
    ``delay``; ``stats()`` has ``in_flight``, ``max_in_flight`` and the ``keys`` received."""
    return ReceiverProcess(("bench/slow_receivers.py", "--receiver", str(delay)), cwd=settings.BASE_DIR)


def other_connections() -> int:
    """Connections to the test database other than the one asking."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@pytest.mark.slow
def test_hundreds_of_sends_in_flight_on_one_loop_hold_three_database_connections_and_few_threads(
    postgres, make_connector, make_command, queue
):
    receiver = slow_receiver(1.0)
    try:
        connectors = [make_connector(f"c{n}", url=receiver.url, max_in_flight=100) for n in range(3)]
        for n in range(600):
            make_command(connectors[n % 3], {"order": n})
        sweep()
        summaries = []
        with Dispatcher(concurrency=300, per_connector=100, batch=300, queue=queue) as dispatcher:

            def run() -> None:
                try:
                    summaries.append(dispatcher.drain())
                finally:
                    connections.close_all()  # this thread's own connection (claims, loading)

            drain = threading.Thread(target=run)
            threads_before = threading.active_count()
            drain.start()
            peak_connections = peak_threads = peak_held = 0
            while drain.is_alive():
                peak_connections = max(peak_connections, other_connections())
                peak_threads = max(peak_threads, threading.active_count())
                peak_held = max(peak_held, receiver.stats()["in_flight"])
                time.sleep(0.05)
            drain.join()
        stats = receiver.stats()
    finally:
        receiver.stop()
    assert summaries[0].results == {"succeeded": 600}
    assert peak_held == stats["max_in_flight"] == 300
    # The drain's own thread (claims, loading), the start thread and the recorder's: one each.
    assert 1 <= peak_connections <= 3
    # The drain, the start and recorder threads, the loop, the loop's resolver executor at most:
    # nothing grows with the sends in flight.
    assert peak_threads - threads_before <= 12
    assert all(count == 1 for count in stats["keys"].values()) and len(stats["keys"]) == 600


def test_a_celery_drain_sends_on_the_processs_loop_not_a_thread_per_send(
    make_connector, make_command, queue, caplog
):
    connector = make_connector(kind="log")
    for n in range(20):
        make_command(connector, {"order": n})
    sweep()
    with caplog.at_level(logging.INFO, logger="ankusa.connector"):
        result = tasks.consume()
    assert result["results"] == {"succeeded": 20}
    sends = [record for record in caplog.records if record.name == "ankusa.connector"]
    assert len(sends) == 20
    assert {record.threadName for record in sends} == {event_loop.THREAD_NAME}
    assert not [
        t for t in threading.enumerate() if t.name.startswith("send-") and t.name != event_loop.THREAD_NAME
    ]


def test_a_forked_worker_process_starts_a_loop_of_its_own():
    """Celery's prefork workers fork after the parent may have started its loop: the child's is new."""
    parent = event_loop.get()

    async def pid() -> int:
        return os.getpid()

    assert event_loop.run(pid()) == os.getpid()
    child = os.fork()
    if child == 0:  # the child: exit 0 if its loop runs in it, and is not the parent's
        code = 1
        try:
            code = (
                0 if event_loop.get() is not parent and event_loop.run(pid(), timeout=5) == os.getpid() else 2
            )
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_synchronous_send_refuses_to_run_on_the_loop_itself():
    async def inside() -> str:
        try:
            event_loop.run(inside_again())
        except RuntimeError as exc:
            return str(exc)
        return "ran"

    async def inside_again() -> None:
        return None

    assert "on the send loop" in event_loop.run(inside())


@pytest.mark.slow
def test_kill_9_with_1000_sends_in_flight_loses_nothing_and_sends_nothing_twice(
    postgres, tenant, queue, service_env
):
    receiver = slow_receiver(5.0)
    try:
        # Not idempotent: a second send would be a second order.
        made = [
            Connector.objects.create(
                tenant=tenant, name=f"k{c}", kind="http", url=receiver.url, max_in_flight=125
            )
            for c in range(8)
        ]
        Command.objects.bulk_create(
            [Command(tenant=tenant, connector=made[i % 8], payload={"order": i}) for i in range(1500)]
        )
        env = {
            **service_env,
            "ANKUSA_DISPATCH_CONCURRENCY": "1000",
            "ANKUSA_DISPATCH_BATCH": "500",
            "ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S": "10",
            "ANKUSA_HTTP_CONNECT_TIMEOUT_S": "1",
            "ANKUSA_HTTP_READ_TIMEOUT_S": "7",
            "ANKUSA_DISPATCH_RECOVER_S": "1",
            "ANKUSA_DISPATCH_INTERVAL_S": "0.5",
        }
        command = [sys.executable, "manage.py", "dispatch"]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": settings.BASE_DIR}
        first = subprocess.Popen(command, env=env, **quiet)
        try:
            wait_for(lambda: receiver.stats()["in_flight"] >= 1000, timeout=60, what="1,000 sends in flight")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        in_flight_at_kill = Command.objects.filter(state=State.DISPATCHING).count()
        assert in_flight_at_kill >= 1000
        second = subprocess.Popen(command, env=env, **quiet)
        try:
            wait_for(
                lambda: not Command.objects.exclude(state__in=[State.SUCCEEDED, State.FAILED]).exists(),
                timeout=180,
                what="every command to end",
            )
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=60)
        keys = receiver.stats()["keys"]
    finally:
        receiver.stop()
    assert [key for key, count in keys.items() if count > 1] == []
    succeeded = set(Command.objects.filter(state=State.SUCCEEDED).values_list("pk", flat=True))
    assert all(str(pk) in keys for pk in succeeded)
    lost = Command.objects.filter(state=State.FAILED)
    # The sends in flight at the kill: unknown whether they went out, so never sent again.
    reasons = Counter(lost.values_list("skip_reason", "last_error_class"))
    assert reasons[("outlook-unknown", WORKER_LOST)] == in_flight_at_kill, reasons
    # Any other failure is a send that failed after the restart (a timeout on this loaded machine),
    # recorded with its reason and, the connector not being idempotent, never sent again.
    assert "" not in {reason for reason, _ in reasons}, reasons
    assert len(succeeded) + lost.count() == 1500
