"""``bench/admin.py --quick`` still runs and ends with its JSON line (a smoke test, not a measurement)."""

import os

import pytest
from django.conf import settings

from tests.commands.test_bench import quick_figures

pytestmark = [pytest.mark.slow, pytest.mark.machine]


def test_the_admin_benchmark_runs_in_quick_mode_with_the_same_queries_at_both_sizes(service_env):
    # Its own database (bench_admin_<pid>), named from DATABASE_URL apart from the tests' own.
    database = os.environ.get("DATABASE_URL", f"sqlite:///{settings.VAR_DIR / 'ankusa.sqlite3'}")
    figures = quick_figures("bench/admin.py", {**service_env, "DATABASE_URL": database})
    assert figures["quick"] is True
    assert (figures["small"], figures["large"]) == (100, 2000)
    assert figures["queries_small"] == figures["queries_large"]
    assert figures["failed_list_100k_vs_1k"] > 0
