"""Celery as a first-class engine: it starts from the runtime requirements alone, and a worker
killed while it drains stalls the others for seconds (the poll lock is short and renewed)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.core.cache import caches

from commands import tasks
from commands.dispatch.sends import WORKER_LOST
from commands.dispatch.sweep import sweep
from commands.lifecycle import QUEUE_NAME, commands_queue, item_payload
from commands.models import Command
from commands.states import State
from queues.backends import get_queue
from tests.commands.children import Output, start, stop
from tests.commands.sink import Gate
from tests.servers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def celery(python: str, env: dict, *args: str) -> Output:
    return start([python, "-m", "celery", "-A", "ankusa_site", *args], cwd=settings.BASE_DIR, env=env)


def worker(python: str, env: dict, name: str, pool: tuple[str, ...] = ("--pool", "solo")) -> Output:
    """A worker that runs its tasks in its own process, or with ``pool`` as deployed: ``("--pool",
    "prefork", "--concurrency", "1")``."""
    return celery(
        python, env, "worker", *pool, "-n", f"{name}@%h",
        "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "info",
    )  # fmt: skip


def beat(python: str, env: dict, folder) -> Output:
    return celery(
        python, env, "beat", "--schedule", str(folder / "beat-schedule"), "--pidfile", "", "-l", "info"
    )


def test_celery_worker_and_beat_run_a_task_from_a_venv_of_the_runtime_requirements_alone(
    make_connector, make_command, redis_client, service_env, tmp_path
):
    venv = tmp_path / "venv"
    # No pip of its own: the runner's installs into it (ensurepip and byte-compiling every module
    # were most of the set-up's time), and nothing but the requirements is in it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python]
    installed = subprocess.run(
        [*pip, "install", "--quiet", "--no-compile", "-r", str(settings.BASE_DIR / "requirements.txt")],
        capture_output=True,
        text=True,
        timeout=900,
    )  # pip's own cache makes a second run quick
    assert installed.returncode == 0, installed.stderr
    # Nothing of the test runner's own environment: only the site's code and that venv.
    env = {
        **{name: value for name, value in service_env.items() if name not in ("PYTHONPATH", "VIRTUAL_ENV")},
        "PYTHONPATH": str(settings.BASE_DIR),
        "ANKUSA_DISPATCH_INTERVAL_S": "1",
    }
    assert subprocess.run([python, "-c", "import pytest"], env=env, capture_output=True).returncode != 0

    get_queue(QUEUE_NAME).flush()
    command = make_command(make_connector(kind="log"))
    running = [worker(python, env, "runtime"), beat(python, env, tmp_path)]
    try:

        def sent() -> bool:
            for one in running:  # a process that could not start fails the test at once
                assert one.process.poll() is None, one.text()
            return Command.objects.get(pk=command.pk).state == State.SUCCEEDED

        wait_for(sent, timeout=90, what="beat's sweep to be run by the worker")
    finally:
        worker_output, beat_output = (stop(one) for one in running)
        print(worker_output, beat_output)  # shown when the test fails
    assert "Sending due task commands-sweep" in beat_output, beat_output
    assert "Task commands.sweep[" in worker_output and " succeeded in " in worker_output, worker_output


def test_a_celery_worker_killed_while_it_drains_stalls_the_other_for_seconds_only(
    make_connector, make_command, redis_client, service_env, sink, tmp_path
):
    get_queue(QUEUE_NAME).flush()
    connector = make_connector(url=sink.url)
    commands = [make_command(connector, {"order": n}) for n in range(24)]
    sweep()  # queued with their items, as intake leaves them: only polls drain them
    sink.respond = gate = Gate()
    env = {
        **service_env,
        "ANKUSA_DISPATCH_POLL_S": "0.2",
        "ANKUSA_DISPATCH_INTERVAL_S": "3600",  # no sweep, and a drain as long as the backlog
        "ANKUSA_DISPATCH_CONCURRENCY": "4",
        "ANKUSA_DISPATCH_PER_CONNECTOR": "4",
        "ANKUSA_HTTP_CONNECT_TIMEOUT_S": "1",
        # The held sends outlast the kill; the visibility timeout follows: 1 + 10 + 10 s.
        "ANKUSA_HTTP_READ_TIMEOUT_S": "10",
    }
    first = worker(sys.executable, env, "first")
    scheduler = beat(sys.executable, env, tmp_path)
    second = None
    try:
        wait_for(lambda: sink.in_flight == 4, timeout=60, what="the first worker to drain")
        second = worker(sys.executable, env, "second")
        wait_for(lambda: second.has("ready."), timeout=60, what="the second worker to start")
        wait_for(
            lambda: second.has("'busy': True"), timeout=30, what="the second worker to find the lock held"
        )
        first.process.kill()  # SIGKILL, mid-drain: its lock is never released
        killed = time.monotonic()
        first.process.wait()
        gate.open.set()
        wait_for(lambda: len(sink.received) > 4, timeout=30, what="the second worker to send")
        stalled = time.monotonic() - killed
        # What the killed worker held comes back after the visibility timeout (beat's recover).
        wait_for(
            lambda: not Command.objects.filter(state__in=[State.QUEUED, State.DISPATCHING]).exists(),
            timeout=90,
            what="every command to end",
        )
    finally:
        stop(scheduler)
        output = stop(second) if second is not None else ""
        stop(first)
    # The lock's time to live, a poll period and a worker's pick-up: seconds, not a drain's length.
    assert stalled < tasks.POLL_LOCK_TTL_S + 3, (stalled, output)
    assert sink.keys_received_more_than_once() == {}
    assert "Task commands.poll[" in output
    # The four the killed worker was sending: nobody knows whether they went out.
    assert Command.objects.filter(state=State.SUCCEEDED).count() == len(commands) - 4
    assert set(Command.objects.filter(state=State.FAILED).values_list("last_error_class", flat=True)) == {
        WORKER_LOST
    }


def test_a_poll_keeps_its_short_lock_while_its_drain_runs_and_releases_it_after(
    redis_client, make_connector, make_command, monkeypatch
):
    get_queue(QUEUE_NAME).flush()
    commands_queue().enqueue(item_payload(make_command(make_connector(kind="log")).pk, 1))
    monkeypatch.setattr(tasks, "POLL_LOCK_TTL_S", 0.3)
    left = []

    def draining() -> dict:
        time.sleep(1.0)  # three times the lock's time to live: held only because it is renewed
        left.append(caches["redis"].pttl(tasks.POLL_LOCK))
        return tasks.NOTHING

    monkeypatch.setattr(tasks, "_drain", draining)
    assert tasks.poll() == tasks.NOTHING
    assert 0 < left[0] <= 300
    assert caches["redis"].get(tasks.POLL_LOCK) is None
