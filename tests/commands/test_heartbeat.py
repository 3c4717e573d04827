"""Is the dispatch loop alive: every round records its process's heartbeat, and the dashboard warns
when none has run a round for 2 × the poll period plus the round interval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection, connections
from django.urls import reverse

from commands import tasks
from commands.dispatch import heartbeat
from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.rounds import run_round
from commands.lifecycle import QUEUE_NAME
from commands.models import DispatcherHeartbeat
from limits.models import Tenant
from queues.backends import get_queue
from tests.commands.staff import login_as

T0 = datetime(2026, 12, 1, 13, 0, tzinfo=UTC)
INDEX = reverse("admin:index")
LIMIT = timedelta(seconds=2 * settings.ANKUSA_DISPATCH_POLL_S + settings.ANKUSA_DISPATCH_INTERVAL_S)


@pytest.fixture
def staff(client, db):
    login_as(client, None)
    return client


def test_a_beat_creates_one_row_per_process_then_moves_it_on(db):
    heartbeat.beat("loop", now=T0)
    heartbeat.beat("loop", now=T0 + timedelta(seconds=30))
    row = DispatcherHeartbeat.objects.get()
    assert (row.name, row.kind, row.started_at, row.last_round_at, row.rounds) == (
        heartbeat.process_name(),
        "loop",
        T0,
        T0 + timedelta(seconds=30),
        2,
    )


def test_a_process_silent_for_a_week_is_forgotten_by_the_next_new_one(db):
    DispatcherHeartbeat.objects.create(
        name="gone:1", kind="loop", started_at=T0 - timedelta(days=9), last_round_at=T0 - timedelta(days=8)
    )
    DispatcherHeartbeat.objects.create(
        name="recent:2", kind="loop", started_at=T0 - timedelta(days=1), last_round_at=T0 - timedelta(days=1)
    )
    heartbeat.beat("celery", now=T0)
    assert sorted(DispatcherHeartbeat.objects.values_list("name", flat=True)) == sorted(
        ["recent:2", heartbeat.process_name()]
    )


def test_a_beat_that_cannot_be_written_is_logged_and_spoils_nothing(db, caplog):
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {DispatcherHeartbeat._meta.db_table}")  # undone with the test
    heartbeat.beat("loop", now=T0)  # no exception
    assert "dispatch heartbeat: not recorded" in caplog.text
    assert Tenant.objects.count() == 0  # the test's transaction still answers (PostgreSQL too)


@pytest.mark.django_db(transaction=True)
def test_a_dispatch_round_records_the_loops_heartbeat():
    queue = get_queue(QUEUE_NAME)
    queue.flush()
    try:
        with time_machine.travel(T0, tick=False), Dispatcher(concurrency=1, queue=queue) as running:
            run_round(running)
    finally:
        connections.close_all()
    row = DispatcherHeartbeat.objects.get()
    assert (row.kind, row.last_round_at, row.rounds) == ("loop", T0, 1)


def test_the_celery_sweep_records_a_celery_heartbeat(db):
    with time_machine.travel(T0, tick=False):
        tasks.sweep()  # called in-process: the task's body, as a worker runs it
    row = DispatcherHeartbeat.objects.get()
    assert (row.kind, row.last_round_at) == ("celery", T0)


def test_the_dashboard_warns_when_no_process_ever_ran_a_round(staff):
    html = staff.get(INDEX).content.decode()
    assert 'id="ankusa-alive-warning"' in html
    assert "No dispatch process has run a round: nothing is sent." in html


def test_the_dashboard_shows_each_process_and_no_warning_while_one_is_fresh(staff):
    heartbeat.beat("loop", now=T0 - LIMIT)
    with time_machine.travel(T0, tick=False):
        html = staff.get(INDEX).content.decode()
    assert 'id="ankusa-alive-warning"' not in html
    assert f"dispatch loop <code>{heartbeat.process_name()}</code>" in html
    assert f"{int(LIMIT.total_seconds())} s without one" in html


def test_the_dashboard_warns_once_every_process_is_older_than_the_limit(staff):
    heartbeat.beat("loop", now=T0 - LIMIT - timedelta(seconds=1))
    with time_machine.travel(T0, tick=False):
        html = staff.get(INDEX).content.decode()
    assert (
        f"No dispatch process has run a round for more than {LIMIT.total_seconds():g} s: nothing is sent"
        in html
    )


def test_the_dashboard_reloads_itself_with_no_outside_script(staff):
    html = staff.get(INDEX).content.decode()
    assert 'id="ankusa-refresh" data-seconds="30" checked' in html
    assert "location.reload()" in html
    assert "<script src=" not in html.split('id="ankusa-refresh"')[1].split("</script>")[0]
