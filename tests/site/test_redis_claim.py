"""Each test run's own Redis database: claimed by a file lock that a flush cannot undo."""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest
from django.conf import settings

from tests import redis_claim

CLAIMER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tests import redis_claim

    go = Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.001)
    claim = redis_claim.claim(sys.argv[3], lock_dir=Path(sys.argv[1]))
    print(claim.db, flush=True)
    sys.stdin.read()  # hold the claim until the test closes our stdin
    """
)


SETTINGS_NUMBER = textwrap.dedent(
    """
    import os, subprocess, sys
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    from django.conf import settings
    print(settings.TEST_REDIS_DB, flush=True)
    if len(sys.argv) > 1:  # a worker: and a subprocess of it, as its tests start them
        subprocess.run([sys.executable, "-c", sys.argv[1]], check=True)
    """
)


def _mark_all_used(lock_dir):
    """Lock files as an earlier run leaves them, so a claim needs no empty database."""
    for db in redis_claim.CANDIDATES:
        redis_claim.lock_path(settings.REDIS_URL, db, lock_dir).write_bytes(redis_claim.USED)


def _start_claimer(tmp_path, python):
    return subprocess.Popen(
        [python, "-c", CLAIMER, str(tmp_path / "locks"), str(tmp_path / "go"), settings.REDIS_URL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=settings.BASE_DIR,
    )


def test_two_runs_starting_at_once_claim_different_databases(tmp_path, python):
    (tmp_path / "locks").mkdir()
    _mark_all_used(tmp_path / "locks")
    claimers = [_start_claimer(tmp_path, python) for _ in range(4)]
    try:
        (tmp_path / "go").touch()
        numbers = [int(claimer.stdout.readline()) for claimer in claimers]
    finally:
        for claimer in claimers:
            claimer.stdin.close()
            claimer.wait(timeout=10)
    assert sorted(numbers) == [12, 13, 14, 15]


def test_a_claim_holds_across_a_flush_and_ends_with_its_holder(tmp_path, redis_client):
    _mark_all_used(tmp_path)
    first = redis_claim.claim(settings.REDIS_URL, lock_dir=tmp_path)
    redis_client.flushdb()  # what the fixtures do around every test: the lock is not in Redis
    second = redis_claim.claim(settings.REDIS_URL, lock_dir=tmp_path)
    assert (first.db, second.db) == (15, 14)
    first.release()
    third = redis_claim.claim(settings.REDIS_URL, lock_dir=tmp_path)
    assert third.db == 15
    second.release()
    third.release()


def test_a_database_holding_someone_elses_keys_is_not_claimed(tmp_path, redis_client):
    own = [settings.TEST_REDIS_DB]
    redis_client.set("someone-else", "1")
    with pytest.raises(RuntimeError, match="set ANKUSA_TEST_REDIS_DB"):
        redis_claim.claim(settings.REDIS_URL, lock_dir=tmp_path, candidates=own)
    # Refusing it left no mark: the same lock file does not make it ours afterwards.
    with pytest.raises(RuntimeError):
        redis_claim.claim(settings.REDIS_URL, lock_dir=tmp_path, candidates=own)
    redis_client.flushdb()
    claim = redis_claim.claim(settings.REDIS_URL, lock_dir=tmp_path, candidates=own)
    assert claim.db == settings.TEST_REDIS_DB
    claim.release()


def test_a_database_an_earlier_run_left_keys_in_is_claimed_again(tmp_path, redis_client):
    own = [settings.TEST_REDIS_DB]
    redis_client.set("left-by-a-killed-run", "1")
    redis_claim.lock_path(settings.REDIS_URL, settings.TEST_REDIS_DB, tmp_path).write_bytes(redis_claim.USED)
    claim = redis_claim.claim(settings.REDIS_URL, lock_dir=tmp_path, candidates=own)
    assert claim.db == settings.TEST_REDIS_DB
    claim.release()


def test_database_zero_is_never_a_test_database(tmp_path):
    assert 0 not in redis_claim.CANDIDATES
    with pytest.raises(ValueError, match="database 0"):
        redis_claim.claim(settings.REDIS_URL, lock_dir=tmp_path, candidates=[0])


def test_this_run_holds_its_own_database():
    assert settings.REDIS_URL.endswith(f"/{settings.TEST_REDIS_DB}")
    assert redis_claim.hold(settings.REDIS_URL, settings.TEST_REDIS_DB) is None


def test_a_pytest_xdist_worker_takes_a_database_of_its_own_and_its_subprocesses_use_it(python):
    # A worker inherits the environment of the run that started it, this run's number in it.
    worker = subprocess.run(
        [python, "-c", SETTINGS_NUMBER, SETTINGS_NUMBER],
        env={**os.environ, "PYTEST_XDIST_WORKER": "gw7"},
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr
    own, its_subprocess = (int(number) for number in worker.stdout.split())
    assert own != settings.TEST_REDIS_DB
    assert its_subprocess == own
