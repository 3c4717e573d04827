"""``bench/dispatch.py``, ``bench/intake.py``, ``bench/intake_ops.py``, ``bench/intake_ab.py``,
``bench/intake_statement.py`` and ``bench/slow_receivers.py`` (PostgreSQL) still run, short, and end
with their JSON line (smoke tests, not measurements)."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

pytestmark = [pytest.mark.slow, pytest.mark.machine]


def quick_figures(script: str, env: dict, *options: str) -> dict:
    result = subprocess.run(
        [sys.executable, script, "--quick", *options],
        cwd=settings.BASE_DIR,
        env={**env, "DJANGO_SETTINGS_MODULE": "ankusa_site.settings"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_dispatch_benchmark_runs_in_quick_mode_and_loses_nothing(service_env):
    # Its own database, named apart from the tests' (it derives it from DATABASE_URL).
    database = os.environ.get("DATABASE_URL", f"sqlite:///{settings.VAR_DIR / 'ankusa.sqlite3'}")
    figures = quick_figures("bench/dispatch.py", {**service_env, "DATABASE_URL": database})
    assert (figures["lost"], figures["double_sent"], figures["quick"]) == (0, 0, True)
    assert figures["dispatch_vs_raw_http"] > 0
    # The loop as deployed and every fast path stock, each in a process of its own.
    assert set(figures["own_process"]) == {"fast", "stock"}
    assert figures["stock_buys"] > 0
    assert figures["stock_buys_cpu"] > 1  # the stock child ran the ORM's way: more CPU a command
    own = figures["own_process"]  # and more of its own, the loop's process
    assert own["stock"]["cpu_ms"]["loop"] > own["fast"]["cpu_ms"]["loop"]


def test_the_intake_benchmark_runs_in_quick_mode_and_every_2xx_was_stored(service_env):
    database = os.environ.get("DATABASE_URL", "")  # its PostgreSQL part runs when the suite's does
    figures = quick_figures("bench/intake.py", {**service_env, "DATABASE_URL": database}, "--without-waits")
    assert (figures["accepted_not_stored"], figures["non_2xx"], figures["quick"]) == (0, 0, True)
    assert figures["intake_vs_bare_view_sqlite"] > 0
    assert figures["intake_vs_bare_view_paired_sqlite"] > 0
    assert figures["intake_vs_obvious_django_sqlite"] > 0  # the peer answered 2xx, on the same server
    assert figures["durable_floor_vs_bare_view_sqlite"] > 0  # and the floor, whose rows are its own
    assert figures["cpu_ms_sqlite"]["floor"]["workers"] > 0
    assert figures["intake_vs_bare_view_stock_sqlite"] > 0  # and the site with every fast path stock
    assert figures["intake_vs_bare_view_cpu_sqlite"] > 0  # /proc was read around the rounds
    assert figures["cpu_ms_sqlite"]["intake"]["workers"] > 0
    assert (figures["intake_vs_bare_view"] is not None) == database.startswith("postgres")
    # The what-if servers (PostgreSQL with the fleet store only) answered too.
    assert ("intake_vs_bare_view_without_either_wait" in figures) == database.startswith("postgres")


def test_the_intake_instruction_count_runs_and_every_webhook_was_accepted(service_env):
    database = os.environ.get("DATABASE_URL", "")
    result = subprocess.run(
        [sys.executable, "bench/intake_ops.py", "--requests", "5"],
        cwd=settings.BASE_DIR,
        env={**service_env, "DATABASE_URL": database, "DJANGO_SETTINGS_MODULE": "ankusa_site.settings"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["answers_sqlite"] == {"202": 10}  # five counted of each kind; the bare view says 202 too
    assert figures["opcodes_webhook_sqlite"] > figures["opcodes_bare_sqlite"] > 0
    assert figures["cpu_us_webhook_sqlite"] > 0 and figures["cpu_us_bare_sqlite"] > 0
    assert ("opcodes_webhook" in figures) == database.startswith("postgres")
    # and there, the same webhooks with their round trips answered from a recording
    assert ("cpu_us_webhook_without_round_trips" in figures) == database.startswith("postgres")


def test_the_gunicorn_settings_comparison_runs_in_quick_mode_and_every_2xx_was_stored(service_env):
    database = os.environ.get("DATABASE_URL", "")
    figures = quick_figures(
        "bench/intake_ab.py",
        {**service_env, "DATABASE_URL": database},
        "--baseline",
        "bench.gunicorn_stock_worker",
    )
    assert (figures["accepted_not_stored"], figures["quick"]) == (0, True)
    assert figures["webhook_cpu_candidate_vs_baseline_sqlite"] > 0
    assert figures["bare_per_s_candidate_vs_baseline_sqlite"] > 0
    assert set(figures["cpu_ms_webhook_sqlite"]) == {"baseline", "candidate"}
    assert ("webhook_cpu_candidate_vs_baseline" in figures) == database.startswith("postgres")


@pytest.mark.skipif(not os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="PostgreSQL only")
def test_the_intake_statement_benchmark_runs_in_quick_mode_and_removes_every_part(service_env):
    figures = quick_figures(
        "bench/intake_statement.py", {**service_env, "DATABASE_URL": os.environ["DATABASE_URL"]}
    )
    assert figures["quick"] is True
    # Each step ran: the floor, the statement, five removals, then both without a synchronous commit.
    assert len(figures["backend_us"]) == 9
    assert figures["statement_vs_floor"] > 0


@pytest.mark.skipif(not os.environ.get("DATABASE_URL", "").startswith("postgres"), reason="PostgreSQL only")
def test_the_slow_receivers_benchmark_runs_in_quick_mode_and_loses_nothing(service_env):
    figures = quick_figures(
        "bench/slow_receivers.py", {**service_env, "DATABASE_URL": os.environ["DATABASE_URL"]}
    )
    runs = [figures, figures["d200"], figures["defaults"]]
    assert [(run["lost"], run["double_sent"]) for run in runs] == [(0, 0)] * 3
    # The kill -9 run is the full benchmark's: tests/commands/test_send_loop.py holds its claim.
    assert (figures["quick"], figures["kill"]) == (True, None)
    assert max(run["db_connections_max"] for run in runs) <= 8
