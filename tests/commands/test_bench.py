"""``bench/dispatch.py --quick`` still runs and ends with its JSON line (a smoke test, not a measurement)."""

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

pytestmark = pytest.mark.slow


def test_the_dispatch_benchmark_runs_in_quick_mode_and_loses_nothing(service_env):
    # Its own database, named apart from the tests' (it derives it from DATABASE_URL).
    env = {**service_env, "DJANGO_SETTINGS_MODULE": "ankusa_site.settings"}
    env["DATABASE_URL"] = os.environ.get("DATABASE_URL", f"sqlite:///{settings.VAR_DIR / 'ankusa.sqlite3'}")
    result = subprocess.run(
        [sys.executable, "bench/dispatch.py", "--quick"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert (figures["lost"], figures["double_sent"], figures["quick"]) == (0, 0, True)
    assert figures["dispatch_vs_raw_http"] > 0
