"""``bench/latency.py`` (PostgreSQL) still runs, short, and ends with its JSON line: both queues'
figures, every webhook seen by the receiver (a smoke test, not a measurement), with the loop or
Celery sending; its ``--web-nice``
reaches every thread of gunicorn's processes; its second loaded phase runs only when the first
filled the machine."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

pytestmark = [pytest.mark.slow, pytest.mark.machine]

KEYS = (
    "e2e_p50_ms_idle",
    "e2e_p99_ms_idle",
    "e2e_p50_ms_half_load",
    "e2e_p99_ms_half_load",
    "celery_hop_p50_ms",
    "e2e_vs_celery_hop_p50",
)

# The second loaded phase's: all null when the first took the rate offered.
SITE_KEYS = (
    "site_half_load_per_s",
    "e2e_p50_ms_site_half_load",
    "e2e_p99_ms_site_half_load",
    "machine_busy_site_half_load",
)


def quick_run(service_env, *options: str) -> dict:
    database = os.environ.get("DATABASE_URL", "")
    if not database.startswith("postgres"):
        pytest.skip("bench/latency.py measures PostgreSQL: run with DATABASE_URL=postgres://...")
    result = subprocess.run(
        [sys.executable, "bench/latency.py", "--quick", *options],
        cwd=settings.BASE_DIR,
        # Its own database (lat_<db>) beside the tests'; Redis: this run's own number.
        env={
            **service_env,
            "DATABASE_URL": database,
            "REDIS_URL": settings.REDIS_URL,
            "DJANGO_SETTINGS_MODULE": "ankusa_site.settings",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["quick"] is True
    return figures


def assert_measured(queue: dict) -> None:
    assert all(queue[key] > 0 for key in KEYS), queue
    # Every webhook of each phase was measured: the receiver got each command.
    assert queue["idle_n"] == 8 and queue["half_load_n"] > 0
    assert queue["site_carries_per_s"] >= queue["machine_carries_per_s"] > 0
    site = [queue[key] for key in SITE_KEYS]
    assert site == [None] * 4 or all(value > 0 for value in site), queue


def test_the_latency_benchmark_runs_in_quick_mode_on_both_queues(service_env, redis_client):
    figures = quick_run(service_env)
    assert "engine" not in figures  # the loop sends
    for queue in (figures, figures["redis_queue"]):
        assert_measured(queue)


def test_the_latency_benchmark_runs_with_a_celery_worker_and_beat_sending(service_env, redis_client):
    figures = quick_run(service_env, "--engine", "celery", "--queues", "database")
    assert figures["engine"] == "celery" and "redis_queue" not in figures
    assert_measured(figures)
    assert figures["half_load_cpu_ms"]["dispatch"] > 0  # the worker's pool processes counted


def test_web_nice_reaches_every_thread_of_the_processes_it_names():
    from bench.latency import renice

    started = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); print(1, flush=True)"
    child = subprocess.Popen([sys.executable, "-c", started], stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()  # its second thread runs
        renice([child.pid], 3)
        tasks = os.listdir(f"/proc/{child.pid}/task")
        assert len(tasks) == 2
        assert [os.getpriority(os.PRIO_PROCESS, int(task)) for task in tasks] == [3, 3]
    finally:
        child.kill()
        child.wait()


def test_the_site_half_load_runs_only_when_intake_could_not_take_the_rate_offered():
    from bench.latency import site_half_rate

    assert site_half_rate(offered=500.0, achieved=300.0) == 150.0  # the machine was full
    assert site_half_rate(offered=500.0, achieved=490.0) is None  # it took the rate: room left


def test_what_the_machine_carries_is_its_cores_over_what_a_webhook_costs_them_all():
    from bench.latency import carried_per_s

    cost = {"intake": 2.0, "dispatch": 1.0, "postgresql": 0.75, "redis": 0.25}  # 4 ms a webhook
    assert carried_per_s(cost, cores=2) == 500.0
    assert carried_per_s({}, cores=2) is None  # no figure, no claim


def test_the_table_shows_a_phase_that_ran_on_one_queue_only_as_a_dash_on_the_other():
    from bench.latency import table

    figures = {
        "e2e_p99_ms_site_half_load": None,
        "cpu": {"web": 1.5},
        "redis_queue": {"e2e_p99_ms_site_half_load": 26.0, "cpu": {"web": None, "worker": 0.5}},
        "quick": False,
    }
    rows = table(figures)
    assert rows[1].split() == ["e2e_p99_ms_site_half_load", "-", "26.0"]
    assert rows[2].split() == ["cpu.web", "1.5", "-"]
    assert rows[3].split() == ["cpu.worker", "-", "0.5"]
