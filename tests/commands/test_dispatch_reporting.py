"""What the dispatch loop tells operators: one log line per send and per skip decision, and the
attempt, latency, round and recovery metrics."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from prometheus_client import REGISTRY

from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.rounds import run_round
from commands.lifecycle import QUEUE_NAME
from commands.retry import Outlook
from commands.states import State
from queues.backends import get_queue
from tests.commands.sink import script

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)


def sample(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def dispatcher():
    queue = get_queue(QUEUE_NAME)
    queue.flush()
    with time_machine.travel(T0, tick=False), Dispatcher(concurrency=2, queue=queue) as running:
        yield running


def events(caplog) -> list[tuple[str, dict]]:
    return [(r.getMessage(), r.fields) for r in caplog.records if r.name == "ankusa.commands.dispatch"]


def test_a_successful_send_is_one_dispatched_line_and_counted(
    make_connector, make_command, dispatcher, caplog
):
    command = make_command(make_connector("log", kind="log"))
    ok = {"kind": "log", "outcome": "ok", "outlook": ""}
    before, rounds = (
        sample("ankusa_dispatch_attempts_total", **ok),
        sample("ankusa_dispatch_round_seconds_count"),
    )
    with caplog.at_level(logging.INFO, logger="ankusa.commands.dispatch"):
        run_round(dispatcher)
    assert sample("ankusa_dispatch_attempts_total", **ok) == before + 1
    assert sample("ankusa_dispatch_round_seconds_count") == rounds + 1
    assert sample("ankusa_dispatch_latency_seconds_count", kind="log") >= 1
    [(event, fields)] = [e for e in events(caplog) if e[0] == "dispatched"]
    assert {k: fields[k] for k in ("command", "attempt")} == {"command": command.pk, "attempt": 1}


def test_a_failed_send_is_logged_with_its_outlook_and_counted(
    make_connector, make_command, dispatcher, sink, caplog
):
    sink.respond = script(503)
    command = make_command(make_connector(url=sink.url))
    labels = {"kind": "http", "outcome": "failed", "outlook": "again"}
    before = sample("ankusa_dispatch_attempts_total", **labels)
    with caplog.at_level(logging.INFO, logger="ankusa.commands.dispatch"):
        run_round(dispatcher)
    assert sample("ankusa_dispatch_attempts_total", **labels) == before + 1
    [(_, fields)] = [e for e in events(caplog) if e[0] == "dispatch_failed"]
    assert (fields["command"], fields["status"], fields["outlook"]) == (command.pk, 503, "again")


def test_a_skip_is_logged_once_when_decided(make_connector, make_command, dispatcher, caplog):
    command = make_command(make_connector(), state=State.FAILED, attempts=1, last_outlook=Outlook.AGAIN)
    with caplog.at_level(logging.INFO, logger="ankusa.commands.dispatch"):
        run_round(dispatcher)
        run_round(dispatcher)
    skips = [fields for event, fields in events(caplog) if event == "skipped"]
    assert skips == [{"reason": "not-idempotent", "count": 1, "commands": [command.pk]}]


def test_recovered_queue_items_are_counted_by_queue_and_action(db):
    queue = get_queue("reporting-test", backend="database")
    queue.flush()
    queue.enqueue({"n": 1}, {"n": 2})
    queue.claim(2)
    before = sample("ankusa_queue_recovered_total", queue="reporting-test", action="fail")
    assert len(queue.handle_expired(timedelta(0), action="fail")) == 2
    assert sample("ankusa_queue_recovered_total", queue="reporting-test", action="fail") == before + 2
