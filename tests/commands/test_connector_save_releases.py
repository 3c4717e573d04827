"""A connector's save decides again on its waiting commands (items 4 and 9 of issue 22): declaring it
idempotent releases its ``not-idempotent`` commands as a fix releases its ``after-fix`` ones, both
are queued in the save's transaction, the dispatch poll (no round) sends them, and the admin's
message says how many and when."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse
from django.utils import timezone

from commands.dispatch.dispatcher import Dispatcher, drain_waiting
from commands.lifecycle import QUEUE_NAME
from commands.models import Command
from commands.states import State
from queues.backends import get_queue
from tests.commands.staff import login_as, make_failed
from tests.commands.test_admin import form_data
from tests.staff import api_client, staff_user

# The poll's sends run in threads with their own connections: they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)

GOING = "1 of its commands will now go: queued now, sent within the dispatch poll (1 s)."


@pytest.fixture
def queue():
    commands = get_queue(QUEUE_NAME)
    commands.flush()
    return commands


def poll(queue) -> None:
    """What the loop does between rounds every ANKUSA_DISPATCH_POLL_S: drain what waits, no sweep."""
    with Dispatcher(concurrency=2, queue=queue) as loop:
        assert drain_waiting(loop) is not None


def test_declaring_idempotency_in_the_admin_sends_a_parked_not_idempotent_command_at_the_next_poll(
    client, make_connector, sink, queue
):
    login_as(client, "operator")
    connector = make_connector(url=sink.url)
    past = timezone.now() - timedelta(minutes=1)
    parked = make_failed(connector, outlook="again", reason="not-idempotent", next_attempt_at=past)
    never = make_failed(connector, outlook="never", reason="never")
    url = reverse("admin:commands_connector_change", args=[connector.pk])
    response = client.post(url, form_data(connector, idempotent="on"))
    assert response.status_code == 302
    assert GOING in [str(message) for message in get_messages(response.wsgi_request)]
    parked.refresh_from_db()
    assert (parked.state, parked.skip_reason) == (State.QUEUED, "")
    poll(queue)
    assert [request.key for request in sink.received] == [str(parked.pk)]
    parked.refresh_from_db(), never.refresh_from_db()
    assert (parked.state, parked.attempts) == (State.SUCCEEDED, 2)
    assert (never.state, never.skip_reason) == (State.FAILED, "never")


def test_fixing_a_connector_in_the_admin_sends_its_after_fix_commands_at_the_next_poll(
    client, make_connector, sink, queue
):
    login_as(client, "operator")
    connector = make_connector(url="", idempotent=True)
    later = timezone.now() + timedelta(minutes=9)
    waiting = make_failed(connector, outlook="after-fix", reason="backing-off", next_attempt_at=later)
    url = reverse("admin:commands_connector_change", args=[connector.pk])
    response = client.post(url, form_data(connector, url=sink.url, idempotent="on"))
    assert GOING in [str(message) for message in get_messages(response.wsgi_request)]
    poll(queue)
    waiting.refresh_from_db()
    assert (waiting.state, len(sink.received)) == (State.SUCCEEDED, 1)


def test_declaring_idempotency_through_the_api_sends_a_parked_command_at_the_next_poll(
    make_connector, sink, queue
):
    connector = make_connector(url=sink.url)
    past = timezone.now() - timedelta(minutes=1)
    parked = make_failed(connector, outlook="after-fix", reason="not-idempotent", next_attempt_at=past)
    response = api_client(staff_user("operator")).patch(
        f"/api/v1/connectors/{connector.pk}/", {"idempotent": True}, format="json"
    )
    assert response.status_code == 200
    parked.refresh_from_db()
    assert parked.state == State.QUEUED
    poll(queue)
    parked.refresh_from_db()
    assert (parked.state, len(sink.received)) == (State.SUCCEEDED, 1)


def test_withdrawing_idempotency_parks_the_retries_at_once_and_says_so(client, make_connector, queue):
    login_as(client, "operator")
    connector = make_connector(url="http://127.0.0.1:9/", idempotent=True)
    later = timezone.now() + timedelta(minutes=2)
    retrying = make_failed(connector, outlook="again", reason="backing-off", next_attempt_at=later)
    url = reverse("admin:commands_connector_change", args=[connector.pk])
    response = client.post(url, form_data(connector))  # idempotent unticked
    assert "None of its waiting commands goes because of this change; 1 now wait: 1 not-idempotent." in [
        str(message) for message in get_messages(response.wsgi_request)
    ]
    retrying.refresh_from_db()
    assert (retrying.state, retrying.skip_reason) == (State.FAILED, "not-idempotent")
    assert not Command.objects.due(later).exists()  # parked: the sweep does not look at it again


def test_a_save_that_changes_no_decision_says_nothing_about_commands(client, make_connector, queue):
    login_as(client, "operator")
    connector = make_connector(url="http://127.0.0.1:9/")
    make_failed(connector, outlook="never", reason="never")
    url = reverse("admin:commands_connector_change", args=[connector.pk])
    response = client.post(url, form_data(connector, name="renamed"))
    assert not any("its commands" in str(m) for m in get_messages(response.wsgi_request))
    assert not queue.peek("main", 1)
