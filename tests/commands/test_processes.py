"""Faults with real processes: ``manage.py dispatch`` killed with -9, stopped with SIGTERM, run twice
at once, a real Celery worker and beat — all against a local HTTP sink that counts what it receives."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings

from commands.lifecycle import QUEUE_NAME
from commands.models import Command, Source
from commands.states import State
from queues.backends import get_queue
from tests.commands.conftest import HOOK_SECRET
from tests.servers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# A subprocess may only be as slow as a whole send: visibility 2 s > connect 0.5 s + read 1 s.
FAST_RECOVERY = {
    "ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S": "2",
    "ANKUSA_HTTP_CONNECT_TIMEOUT_S": "0.5",
    "ANKUSA_HTTP_READ_TIMEOUT_S": "1",
    "ANKUSA_DISPATCH_INTERVAL_S": "0.2",
    "ANKUSA_DISPATCH_CONCURRENCY": "4",
    "ANKUSA_DISPATCH_PER_CONNECTOR": "4",
}


def start_dispatch(service_env, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "dispatch", *args],
        cwd=settings.BASE_DIR,
        env={**service_env, **FAST_RECOVERY, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen, timeout: float = 60) -> str:
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output
    return output


class Gate:
    """Holds the sink's answers after the first ``free`` requests until it is opened."""

    def __init__(self, free: int):
        self.free = free
        self.open = threading.Event()
        self.seen = 0
        self.lock = threading.Lock()

    def __call__(self, request, nth):
        with self.lock:
            self.seen += 1
            held = self.seen > self.free
        if held:
            self.open.wait(10)
        return 200, {}


@pytest.fixture
def queue(transactional_db):
    q = get_queue(QUEUE_NAME)
    q.flush()
    return q


def test_kill_9_mid_batch_then_restart_ends_every_command_and_never_sends_twice(
    make_connector, make_command, queue, sink, service_env
):
    connector = make_connector(url=sink.url)  # not idempotent: a second send would be a second order
    commands = [make_command(connector, {"order": n}) for n in range(40)]
    sink.respond = gate = Gate(free=10)
    first = start_dispatch(service_env)
    try:
        wait_for(lambda: sink.in_flight == 4, what="four sends held by the sink")
    finally:
        first.kill()  # SIGKILL: no handler, no cleanup
        first.wait()
    gate.open.set()
    # The four held by the sink, and any answered sends the recorder had not written yet.
    in_flight_at_kill = Command.objects.filter(state=State.DISPATCHING).count()
    assert in_flight_at_kill >= 4

    second = start_dispatch(service_env)
    try:
        wait_for(
            lambda: (
                not Command.objects.exclude(state__in=[State.SUCCEEDED, State.FAILED]).exists()
                and queue.length("main") == queue.length("busy") == 0
            ),
            what="every command to end and every item to be finished",
        )
    finally:
        second.send_signal(signal.SIGTERM)
        output = finish(second)

    assert sink.keys_received_more_than_once() == {}
    states = dict(Command.objects.values_list("pk", "state"))
    lost = Command.objects.filter(state=State.FAILED)
    assert lost.count() == in_flight_at_kill
    assert set(lost.values_list("skip_reason", "last_outlook", "last_error_class")) == {
        ("outlook-unknown", "", "WorkerLost")
    }
    succeeded = [pk for pk, state in states.items() if state == State.SUCCEEDED]
    assert len(succeeded) == len(commands) - in_flight_at_kill
    assert all(sink.counts[str(pk)] == 1 for pk in succeeded)
    recovered = [
        int(line.split("recovered ")[1].split(" ")[0]) for line in output.splitlines() if "recovered" in line
    ]
    assert sum(recovered) == in_flight_at_kill


def test_sigterm_finishes_the_sends_in_hand_and_exits_0(
    make_connector, make_command, queue, sink, service_env
):
    connector = make_connector(url=sink.url)
    for n in range(20):
        make_command(connector, {"order": n})
    sink.respond = gate = Gate(free=0)
    process = start_dispatch(service_env)
    wait_for(lambda: sink.in_flight == 4, what="four sends in flight")
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the signal lands while the sends are still held
    gate.open.set()
    output = finish(process)
    assert "dispatch stopped" in output
    assert Command.objects.filter(state=State.SUCCEEDED).count() == 4
    assert Command.objects.filter(state=State.DISPATCHING).count() == 0
    assert (queue.length("main"), queue.length("busy")) == (16, 0)
    assert Command.objects.filter(state=State.QUEUED).count() == 16


def test_two_dispatch_processes_at_once_send_every_command_exactly_once(
    make_connector, make_command, queue, sink, service_env
):
    connectors = [make_connector(f"c{n}", url=sink.url) for n in range(2)]
    commands = [make_command(connectors[n % 2], {"order": n}) for n in range(120)]
    sink.delay = 0.005
    processes = [start_dispatch(service_env, "--once", ANKUSA_DISPATCH_BATCH="7") for _ in range(2)]
    outputs = [finish(process) for process in processes]
    assert sink.counts == {str(c.pk): 1 for c in commands}
    assert Command.objects.filter(state=State.SUCCEEDED).count() == 120
    taken = [
        int(line.split("took ")[1].split(",")[0])
        for out in outputs
        for line in out.splitlines()
        if "took" in line
    ]
    assert sum(taken) == 120


def celery(env: dict, *args: str) -> subprocess.Popen:
    """``celery -A ankusa_site <args>`` with this test's database and Redis (broker included)."""
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ankusa_site", *args],
        cwd=settings.BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def celery_worker(env: dict) -> subprocess.Popen:
    return celery(
        env,
        "worker",
        "--pool",
        "solo",
        "--without-heartbeat",
        "--without-gossip",
        "--without-mingle",
        "-l",
        "info",
    )


def stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=30)
    return output


def test_a_real_celery_worker_takes_a_command_to_succeeded(
    make_connector, make_command, redis_client, service_env
):
    from commands import tasks

    get_queue(QUEUE_NAME).flush()
    command = make_command(make_connector(kind="log"))
    worker = celery_worker(service_env)
    try:
        tasks.sweep.delay()
        wait_for(
            lambda: Command.objects.get(pk=command.pk).state == State.SUCCEEDED,
            timeout=60,
            what="celery to send it",
        )
    finally:
        output = stop(worker)
    assert "Task commands.sweep[" in output and "Task commands.consume[" in output
    assert worker.returncode == 0, output


def test_under_celery_beat_a_command_intake_queued_is_sent_without_waiting_for_a_sweep(
    tenant, make_connector, post_hook, redis_client, service_env, tmp_path
):
    get_queue(QUEUE_NAME).flush()
    source = Source.objects.create(
        tenant=tenant, slug="orders", verifier="github", verifier_secrets=[HOOK_SECRET], dedupe_key="github"
    )
    source.connectors.set([make_connector("log", kind="log")])
    # Sweeps an hour apart: only beat's poll, every 0.2 s, can send what intake queued.
    env = {**service_env, "ANKUSA_DISPATCH_POLL_S": "0.2", "ANKUSA_DISPATCH_INTERVAL_S": "3600"}
    worker = celery_worker(env)
    beat = celery(env, "beat", "--schedule", str(tmp_path / "beat-schedule"), "--pidfile", "", "-l", "info")
    try:
        assert post_hook().status_code == 202
        wait_for(
            lambda: Command.objects.filter(state=State.SUCCEEDED).exists(),
            timeout=60,
            what="beat's poll to send it",
        )
    finally:
        try:
            beat_output = stop(beat)
        finally:
            worker_output = stop(worker)
    assert "Sending due task commands-poll" in beat_output
    assert "Task commands.poll[" in worker_output
    assert "Task commands.sweep[" not in worker_output
    assert worker.returncode == 0, worker_output
