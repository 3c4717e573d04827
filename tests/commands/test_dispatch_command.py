"""``manage.py dispatch``: one round with --once, a bounded run with --max-seconds, a summary line."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from commands import dispatch
from commands.models import Command
from commands.states import State
from queues.fifo import get_queue

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def empty_queue(transactional_db):
    get_queue(dispatch.QUEUE_NAME).flush()


def test_once_runs_one_round_and_prints_its_summary(make_connector, make_command):
    command = make_command(make_connector(kind="log"))
    out = io.StringIO()
    call_command("dispatch", "--once", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        "dispatch round: took 1, skipped none; claimed 1: 1 succeeded; recovered 0 lost sends"
    )
    assert lines[1] == "dispatch stopped"
    command.refresh_from_db()
    assert command.state == State.SUCCEEDED


def test_max_seconds_bounds_a_looping_run(make_connector, make_command):
    out = io.StringIO()
    call_command("dispatch", "--max-seconds", "0.5", "--interval", "0.1", stdout=out)
    rounds = [line for line in out.getvalue().splitlines() if line.startswith("dispatch round")]
    assert 2 <= len(rounds) <= 6
    assert Command.objects.count() == 0


def test_a_failed_round_is_logged_and_the_loop_carries_on(monkeypatch, caplog):
    from commands.management.commands import dispatch as command_module

    real, calls = command_module.run_round, []

    def flaky(dispatcher, **options):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("database went away")
        return real(dispatcher, **options)

    monkeypatch.setattr(command_module, "run_round", flaky)
    out = io.StringIO()
    call_command("dispatch", "--max-seconds", "0.4", "--interval", "0.05", stdout=out)
    assert "dispatch round failed; retrying in 0.05 s" in caplog.text
    assert "dispatch round: took 0" in out.getvalue()
    with pytest.raises(ConnectionError):
        calls.clear()
        call_command("dispatch", "--once", stdout=io.StringIO())
