"""The site boots only with a valid configuration, and says which variable is wrong."""

import subprocess
import sys

import pytest
from django.conf import settings
from django.core.checks import Error, Warning
from django.test import override_settings

from ankusa_site.checks import check_ankusa_settings

pytestmark = pytest.mark.slow


def run_check(env_changes: dict[str, str]) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "ankusa_site.settings", **env_changes}
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_boot_fails_on_a_typo_naming_the_variable(tmp_path):
    result = run_check({"DEBUG": "1", "ANKUSA_VAR_DIR": str(tmp_path), "ANKUSA_STORE_TIMEOUT_MS": "5O"})
    assert result.returncode != 0
    assert "ANKUSA_STORE_TIMEOUT_MS='5O' is not a whole number" in result.stderr


def test_boot_without_debug_requires_a_secret_key(tmp_path):
    result = run_check({"ANKUSA_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "SECRET_KEY is required when DEBUG is off" in result.stderr


def test_boot_with_debug_generates_a_local_secret_key_once(tmp_path):
    assert run_check({"DEBUG": "1", "ANKUSA_VAR_DIR": str(tmp_path)}).returncode == 0
    key = (tmp_path / "secret_key").read_text()
    assert run_check({"DEBUG": "1", "ANKUSA_VAR_DIR": str(tmp_path)}).returncode == 0
    assert (tmp_path / "secret_key").read_text() == key
    assert len(key) >= 50


def test_default_settings_pass_the_system_checks():
    assert check_ankusa_settings(None) == []


@override_settings(ANKUSA_CLAIM_PENDING_TTL_MS=10_000, ANKUSA_CLAIM_TTL_MS=5_000)
def test_a_pending_claim_outliving_the_committed_one_is_an_error():
    assert [p.id for p in check_ankusa_settings(None)] == ["ankusa.E001"]


@override_settings(
    ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S=30, ANKUSA_HTTP_CONNECT_TIMEOUT_S=5, ANKUSA_HTTP_READ_TIMEOUT_S=30
)
def test_a_visibility_timeout_shorter_than_a_send_is_an_error():
    problems = check_ankusa_settings(None)
    assert [p.id for p in problems] == ["ankusa.E002"]
    assert isinstance(problems[0], Error)


@override_settings(ANKUSA_DEFAULT_HOOKS_RATE=5.0, ANKUSA_DEFAULT_HOOKS_BURST=None)
def test_a_default_rate_without_a_burst_is_an_error():
    assert [p.id for p in check_ankusa_settings(None)] == ["ankusa.E003"]


@override_settings(ANKUSA_DISPATCH_PER_CONNECTOR=64, ANKUSA_DISPATCH_CONCURRENCY=8)
def test_a_per_connector_cap_above_the_pool_is_a_warning():
    problems = check_ankusa_settings(None)
    assert [p.id for p in problems] == ["ankusa.W001"]
    assert isinstance(problems[0], Warning)
