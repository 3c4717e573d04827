"""A connector's pacing, set by staff: its own cap on sends in flight and an optional rate (sends a
second), per dispatch process — validated in the model (every door), honoured by dispatch."""

from __future__ import annotations

import threading

import pytest
from django.core.exceptions import ValidationError

from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.senders import _Senders
from commands.dispatch.sends import _Entry
from commands.dispatch.sweep import sweep
from commands.lifecycle import QUEUE_NAME
from commands.models import Command, Connector
from commands.states import State
from queues.backends import get_queue
from queues.fifo import Item

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(db):
    q = get_queue(QUEUE_NAME)
    q.flush()
    return q


def test_a_connectors_own_cap_replaces_the_site_default_both_ways(make_connector, make_command, queue, sink):
    sink.delay = 0.05
    narrow = make_connector("narrow", url=sink.url, max_in_flight=2)
    for _ in range(10):
        make_command(narrow)
    sweep()
    with Dispatcher(concurrency=8, per_connector=4, queue=queue) as dispatcher:
        assert dispatcher.drain().results == {"succeeded": 10}
    assert sink.max_in_flight == 2
    wide = make_connector("wide", url=sink.url, max_in_flight=6)
    for _ in range(12):
        make_command(wide)
    sink.max_in_flight = 0
    sweep()
    with Dispatcher(concurrency=8, per_connector=4, queue=queue) as dispatcher:
        assert dispatcher.drain().results == {"succeeded": 12}
    assert sink.max_in_flight == 6


def waiting(connector: Connector, count: int) -> list[_Entry]:
    command = Command(pk=1, connector=connector, state=State.QUEUED)
    return [_Entry(Item(id=n, payload={}, enqueued_at=None), command, 1) for n in range(count)]


def test_a_connectors_rate_spaces_its_sends_and_leaves_the_others_alone(make_connector):
    paced = make_connector("paced", kind="log", max_per_s=4, max_in_flight=10)
    free = make_connector("free", kind="log", max_in_flight=10)
    senders = _Senders(0, 10, threading.Event(), recorder=None)
    now = [100.0]
    senders.clock = lambda: now[0]
    senders.waiting.extend(waiting(paced, 3) + waiting(free, 2))
    taken = [senders._take().command.connector.name for _ in range(3)]
    assert taken == ["paced", "free", "free"]  # the second paced send is due in 0.25 s
    assert senders._take() is None
    assert senders.pace_wait == pytest.approx(0.25)
    now[0] += 0.1
    assert (senders._take(), senders.pace_wait) == (None, pytest.approx(0.15))
    now[0] += 0.15
    assert senders._take().command.connector.name == "paced"
    now[0] += 0.3  # late: the next one keeps the schedule (due at 100.5), not 0.25 s from now
    assert senders._take().command.connector.name == "paced"
    assert senders.next_due[paced.pk] == pytest.approx(100.75)


def test_a_rate_holds_the_senders_of_a_real_drain(make_connector, make_command, queue, sink):
    paced = make_connector("paced", url=sink.url, max_per_s=20)
    for _ in range(6):
        make_command(paced)
    sweep()
    with Dispatcher(concurrency=4, per_connector=4, queue=queue) as dispatcher:
        assert dispatcher.drain().results == {"succeeded": 6}
    assert sink.max_in_flight == 1  # one every 50 ms against an answer of microseconds


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": 1001}, "max_in_flight"),
        ({"max_per_s": 0}, "max_per_s"),
        ({"max_per_s": 0.001}, "max_per_s"),
        ({"max_per_s": 10_001}, "max_per_s"),
        ({"max_per_s": float("nan")}, "max_per_s"),
        ({"max_per_s": float("inf")}, "max_per_s"),
    ],
)
def test_pacing_out_of_bounds_is_refused_by_the_model(make_connector, fields, error):
    connector = make_connector(kind="log")
    for name, value in fields.items():
        setattr(connector, name, value)
    with pytest.raises(ValidationError) as refused:
        connector.full_clean()
    assert list(refused.value.message_dict) == [error]


def test_the_api_sets_pacing_and_refuses_it_out_of_bounds(world, call):
    connector = world.a.connector
    path = f"/api/v1/connectors/{connector.pk}/"
    status, data = call("operator", "PATCH", path, {"max_in_flight": 50, "max_per_s": 12.5})
    assert (status, data["max_in_flight"], data["max_per_s"]) == (200, 50, 12.5)
    status, data = call("operator", "PATCH", path, {"max_in_flight": 0, "max_per_s": -1})
    assert status == 400
    assert sorted(data["fields"]) == ["max_in_flight", "max_per_s"]
    status, data = call("operator", "PATCH", path, {"max_in_flight": None, "max_per_s": None})
    assert (status, data["max_in_flight"], data["max_per_s"]) == (200, None, None)
