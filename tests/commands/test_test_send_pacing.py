"""A test send is paced one a second per connector, whoever asks at once: threads in one process,
and two gunicorn nodes of two worker processes each. What counts is what the receiver got."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import pytest
from django.db import connection

from commands.models import Connector
from commands.staff import connector_tools
from tests.staff import staff_user, token_for

pytestmark = pytest.mark.django_db(transaction=True)


def sent_at(sink) -> list[datetime]:
    return sorted(datetime.fromisoformat(request.json["sent_at"]) for request in sink.received)


def spaced_by_a_second(times: list[datetime]) -> bool:
    return all(
        b - a >= timedelta(seconds=connector_tools.TEST_INTERVAL_S)
        for a, b in zip(times, times[1:], strict=False)
    )


def test_threads_asking_at_once_send_one_test_and_the_rest_are_too_soon(make_connector, sink):
    connector = make_connector(url=sink.url)
    people = [staff_user("operator", f"op{n}") for n in range(8)]
    start = threading.Barrier(len(people))

    def ask(person):
        start.wait()
        try:
            connector_tools.send_test(Connector.objects.get(pk=connector.pk), by=person)
            return "sent"
        except connector_tools.TooSoon:
            return "too soon"
        finally:
            connection.close()

    with ThreadPoolExecutor(len(people)) as pool:
        answers = Counter(pool.map(ask, people))
    assert answers["sent"] == len(sink.received) >= 1
    assert answers["sent"] + answers["too soon"] == len(people)
    assert spaced_by_a_second(sent_at(sink))  # more than one only if the asks spread over seconds


@pytest.mark.slow
def test_two_nodes_asking_at_once_send_tests_a_second_apart_and_answer_429_otherwise(
    make_connector, sink, start_node
):
    connector = make_connector(url=sink.url)
    token = token_for(staff_user("operator"))
    nodes = [start_node(), start_node()]
    start = threading.Barrier(24)

    def ask(n: int):
        start.wait()
        return nodes[n % 2].request(
            "POST", f"/api/v1/connectors/{connector.pk}/test/", headers={"Authorization": f"Bearer {token}"}
        )

    with ThreadPoolExecutor(24) as pool:
        answers = list(pool.map(ask, range(24)))
    statuses = Counter(status for status, _, _ in answers)
    assert set(statuses) == {200, 429}, statuses
    assert statuses[200] == len(sink.received)
    refused = [(d, h.get("Retry-After")) for s, d, h in answers if s == 429]
    assert all(d["error"] == "too_soon" and after == "1" for d, after in refused), refused
    assert spaced_by_a_second(sent_at(sink))
