"""``ANKUSA_HTTPS=1`` turns on what a site served over HTTPS needs (``ankusa_site.settings``), and
the example environment of ``deploy/`` passes ``manage.py check --deploy`` with nothing to report."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings

pytestmark = pytest.mark.slow

EXAMPLE = settings.BASE_DIR / "deploy" / "ankusa.env.example"


def example_environment() -> dict[str, str]:
    env = {}
    for line in EXAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip()
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        env={"PATH": os.environ["PATH"], **env},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_example_environment_passes_the_deploy_check(tmp_path):
    env = example_environment()
    assert env["ANKUSA_HTTPS"] == "1"
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path)  # the node's folder, made at boot by tmpfiles.d
    checked = manage(env, "check", "--deploy", "--fail-level", "DEBUG")
    assert (checked.returncode, checked.stderr, checked.stdout) == (
        0,
        "",
        "System check identified no issues (2 silenced).\n",
    )


def test_without_https_the_deploy_check_names_what_is_missing(tmp_path):
    env = {**example_environment(), "ANKUSA_HTTPS": "0", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    output = manage(env, "check", "--deploy").stderr
    assert [code for code in ("W004", "W008", "W012", "W016") if f"(security.{code})" in output] == [
        "W004",
        "W008",
        "W012",
        "W016",
    ]
