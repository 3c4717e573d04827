"""A real ``manage.py dispatch`` under a PostgreSQL outage, on a cluster of the test's own that it
stops and starts (``migrated_postgres``), against a counting receiver: what the receiver answered
is written once the database is back — by the loop that kept it, or from the spool of a loop that
had to exit — and the loop is back at work within seconds, not at its next round."""

from __future__ import annotations

import stat
import subprocess
import sys
import time
from collections import Counter

import psycopg
import pytest
from django.conf import settings

from commands.models import Command
from tests.commands.children import Output, start, stop
from tests.commands.sink import Gate
from tests.private_services import MIGRATED
from tests.servers import wait_for

pytestmark = pytest.mark.slow

COMMANDS = Command._meta.db_table


@pytest.fixture
def database(migrated_postgres):
    """The migrated database on the private cluster; its URL."""
    return migrated_postgres.url(MIGRATED)


@pytest.fixture
def loop_env(database, service_env, tmp_path):
    return {
        **service_env,
        "DATABASE_URL": database,
        "ANKUSA_VAR_DIR": str(tmp_path / "var"),
        "ANKUSA_DISPATCH_INTERVAL_S": "3600",  # one round at the start: the rest is drains and retries
        "ANKUSA_DISPATCH_POLL_S": "0.2",
        "ANKUSA_DISPATCH_CONCURRENCY": "4",
        "ANKUSA_DISPATCH_PER_CONNECTOR": "4",
        "ANKUSA_HTTP_CONNECT_TIMEOUT_S": "1",
        "ANKUSA_HTTP_READ_TIMEOUT_S": "20",  # a held send outlasts the outage; visibility 31 s
    }


def make_commands(env: dict, receiver: str, count: int, *, sweep: bool = False) -> None:
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.commands.outage_world",
            receiver,
            str(count),
            *(["--sweep"] if sweep else []),
        ],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr


def states(url: str) -> Counter:
    """``(state, skip reason, last error class)`` → how many commands, read straight from the cluster."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            f"SELECT state, skip_reason, last_error_class, count(*) FROM {COMMANDS} GROUP BY 1, 2, 3"
        ).fetchall()
    return Counter({(state, reason, error): n for state, reason, error, n in rows})


def all_succeeded(url: str, count: int) -> bool:
    try:
        return states(url) == Counter({("succeeded", "", ""): count})
    except psycopg.OperationalError:
        return False


def dispatch_loop(env: dict) -> Output:
    return start([sys.executable, "manage.py", "dispatch"], cwd=settings.BASE_DIR, env=env)


def answered_while_the_database_is_down(migrated_postgres, sink, loop: Output) -> None:
    """Hold four sends at the receiver, stop PostgreSQL, then let the receiver answer them: the
    loop has outcomes it cannot write (and says so, twice: it tries again)."""
    sink.respond = gate = Gate()
    wait_for(lambda: sink.in_flight == 4, timeout=60, what="four sends held by the receiver")
    migrated_postgres.stop("immediate")
    gate.open.set()
    wait_for(lambda: loop.has("finished sends failed; trying again"), what="a failed write")
    wait_for(lambda: loop.has("finished sends failed again"), what="the write tried again")


def test_sends_the_receiver_answered_while_postgresql_was_down_end_succeeded(
    migrated_postgres, database, loop_env, sink
):
    make_commands(loop_env, sink.url, 20)
    loop = dispatch_loop(loop_env)
    try:
        answered_while_the_database_is_down(migrated_postgres, sink, loop)
        migrated_postgres.start()
        wait_for(lambda: all_succeeded(database, 20), timeout=30, what="every command to succeed")
    finally:
        output = stop(loop)
    assert sink.counts == dict.fromkeys(sink.counts, 1) and len(sink.counts) == 20
    assert "dispatch stopped" in output


def test_a_loop_stopped_while_postgresql_is_down_spools_what_was_answered_and_writes_it_at_its_next_start(
    migrated_postgres, database, loop_env, sink, tmp_path
):
    make_commands(loop_env, sink.url, 20)
    loop = dispatch_loop(loop_env)
    try:
        answered_while_the_database_is_down(migrated_postgres, sink, loop)
    finally:
        output = stop(loop)
    assert loop.process.returncode == 0, output
    assert "outcomes_spooled" in output
    folder = tmp_path / "var" / "spool" / "dispatch"
    [spooled] = list(folder.iterdir())
    assert stat.S_IMODE(spooled.stat().st_mode) == 0o600

    migrated_postgres.start()
    assert states(database)[("dispatching", "", "")] == 4  # the answered four, unwritten
    again = dispatch_loop(loop_env)
    try:
        wait_for(lambda: all_succeeded(database, 20), timeout=30, what="every command to succeed")
    finally:
        output = stop(again)
    assert "spool_replayed" in output
    assert list(folder.iterdir()) == []
    assert sink.counts == dict.fromkeys(sink.counts, 1) and len(sink.counts) == 20


def test_the_loop_drains_again_within_seconds_of_postgresql_coming_back_not_at_its_next_round(
    migrated_postgres, database, loop_env, sink
):
    loop = dispatch_loop(loop_env)
    try:
        wait_for(lambda: loop.has("dispatch round:"), timeout=60, what="the first round")
        migrated_postgres.stop("immediate")
        wait_for(lambda: loop.has("dispatch drain failed; retrying in 0.2 s"), what="a failed drain")
        wait_for(lambda: loop.has("retrying in 2 s"), timeout=30, what="the retries at their cap")
        migrated_postgres.start()
        make_commands(loop_env, sink.url, 10, sweep=True)  # queued as intake queues them
        queued = time.monotonic()
        wait_for(lambda: len(sink.counts) == 10, timeout=30, what="the queued commands to be sent")
        resumed = time.monotonic() - queued
        wait_for(lambda: all_succeeded(database, 10), timeout=30, what="every command to succeed")
    finally:
        stop(loop)
    assert resumed < 5  # the next round is an hour away: only the drain's retry sends them


def test_a_killed_loops_sends_are_recovered_within_the_visibility_timeout_and_seconds(
    migrated_postgres, database, loop_env, sink
):
    env = {**loop_env, "ANKUSA_HTTP_READ_TIMEOUT_S": "3", "ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S": "6"}
    make_commands(env, sink.url, 20)
    sink.respond = gate = Gate()
    first = dispatch_loop(env)
    try:
        wait_for(lambda: sink.in_flight == 4, timeout=60, what="four sends held by the receiver")
    finally:
        first.process.kill()  # SIGKILL: what it held is only found by a recovery
        killed = time.monotonic()
        first.process.wait()
    gate.open.set()
    second = dispatch_loop(env)
    try:
        wait_for(
            lambda: (
                sum(n for (state, _, _), n in states(database).items() if state in ("succeeded", "failed"))
                == 20
            ),
            timeout=60,
            what="every command to end",
        )
        ended = time.monotonic() - killed
    finally:
        output = stop(second)
    # The next round is an hour away: only the recovery's own timer (every 2 s) brings them back.
    assert ended < 6 + 5, output
    assert states(database) == Counter(
        {("succeeded", "", ""): 16, ("failed", "outlook-unknown", "WorkerLost"): 4}
    )
    assert "dispatch recovery: recovered 4 lost sends" in output
    assert sink.keys_received_more_than_once() == {}
