"""``manage.py dispatch --once`` in the shell where ``make run`` started the site (DEBUG=1, which
generated ``var/secret_key``) works with no variable set; a serving command still wants a key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

pytestmark = pytest.mark.slow

MESSAGE = "SECRET_KEY is required when DEBUG is off"


def manage(var_dir: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("SECRET_KEY", "DEBUG", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    env.update(ANKUSA_VAR_DIR=str(var_dir), **extra)
    return subprocess.run(
        [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_command_after_make_run_uses_its_generated_key_and_serving_still_needs_one(tmp_path):
    refused = manage(tmp_path, "check")
    assert refused.returncode != 0 and MESSAGE in refused.stderr  # no local key yet: as before

    made = manage(tmp_path, "migrate", "--noinput", DEBUG="1")  # what make run does first
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "secret_key").exists()

    once = manage(tmp_path, "dispatch", "--once")
    assert once.returncode == 0, once.stderr
    assert "dispatch round: took 0" in once.stdout

    serving = manage(tmp_path, "serve", "--bind", "127.0.0.1:1")
    assert serving.returncode != 0 and MESSAGE in serving.stderr


def test_a_secret_key_that_is_set_wins_over_the_local_one(tmp_path):
    (tmp_path / "secret_key").write_text("local-key-" + "y" * 40)
    shown = manage(
        tmp_path,
        "shell",
        "-c",
        "from django.conf import settings; print(settings.SECRET_KEY[:10], settings.DEBUG)",
        SECRET_KEY="from-the-environment-" + "z" * 40,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1].split() == ["from-the-e", "False"]
    local = manage(tmp_path, "shell", "-c", "from django.conf import settings; print(settings.SECRET_KEY)")
    assert local.stdout.splitlines()[-1] == "local-key-" + "y" * 40
