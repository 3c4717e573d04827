"""Everything the site writes under ``ANKUSA_VAR_DIR`` is its owner's only (``ankusa_site.core.varfiles``):
the SQLite database and its write-ahead log were 0644, and they hold signing secrets and credentials."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from django.conf import settings
from django.test import override_settings

from ankusa_site.core.varfiles import create_private, private_dir
from ankusa_site.management.commands.demo import var_secret
from ankusa_site.management.commands.serve import Command as Serve

# A process with the usual umask (022) that writes to a fresh var/: the generated secret key, the
# SQLite database with a transaction in flight (so its -wal and -shm files exist), and the modes.
WRITER = """
import json, os, stat, django
from pathlib import Path
os.umask(0o022)
django.setup()
from django.conf import settings
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("CREATE TABLE t (x)")
    cursor.execute("INSERT INTO t VALUES (1)")
    var = settings.VAR_DIR
    names = ["", "secret_key", "ankusa.sqlite3", "ankusa.sqlite3-wal", "ankusa.sqlite3-shm"]
    print(json.dumps({name: oct(stat.S_IMODE((var / name).stat().st_mode)) for name in names}))
"""


def mode(path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


@pytest.mark.slow
def test_a_fresh_var_folder_the_key_and_the_sqlite_files_are_owner_only(tmp_path):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE")
    }
    env.update(ANKUSA_VAR_DIR=str(tmp_path / "var"), DEBUG="1", DJANGO_SETTINGS_MODULE="ankusa_site.settings")
    out = subprocess.run(
        [sys.executable, "-c", WRITER],
        env=env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "": "0o700",
        "secret_key": "0o600",
        "ankusa.sqlite3": "0o600",
        "ankusa.sqlite3-wal": "0o600",
        "ankusa.sqlite3-shm": "0o600",
    }


def test_a_var_folder_made_before_is_narrowed_to_its_owner(tmp_path):
    folder = tmp_path / "var"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    assert mode(private_dir(folder)) == "0o700"


def test_an_existing_database_file_keeps_the_mode_its_operator_gave_it(tmp_path):
    path = tmp_path / "db.sqlite3"
    path.write_text("")
    path.chmod(0o640)
    assert create_private(path) is False
    assert mode(path) == "0o640"


def test_the_demo_login_and_the_metrics_folder_are_owner_only(tmp_path, monkeypatch):
    old = os.umask(0o022)
    try:
        with override_settings(VAR_DIR=tmp_path / "var"):
            var_secret("demo-login", lambda: "staff:password")
            monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
            env = Serve().child_env()
    finally:
        os.umask(old)
    assert mode(tmp_path / "var") == "0o700"
    assert mode(tmp_path / "var" / "demo-login") == "0o600"
    assert (env["PROMETHEUS_MULTIPROC_DIR"], mode(tmp_path / "var" / "metrics")) == (
        str(tmp_path / "var" / "metrics"),
        "0o700",
    )
