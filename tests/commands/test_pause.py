"""Pause and resume a connector: who may, the audit, no attempt spent while paused, the commands'
explanation, and the admin's and the API's doors (bad input a 4xx with JSON)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.rounds import run_round
from commands.lifecycle import QUEUE_NAME, item_payload
from commands.models import Attempt, AuditEntry, Command, Connector
from commands.staff import pausing
from commands.staff.actions import Refused
from commands.staff.explain import explain
from commands.states import State
from queues.backends import get_queue
from tests.commands.staff import login_as
from tests.servers import wait_for
from tests.staff import staff_user

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


@pytest.mark.parametrize(("group", "may"), [("viewer", False), ("operator", True), ("admin", True)])
def test_operators_and_admins_may_pause_and_viewers_may_not(make_connector, group, may):
    connector = make_connector()
    user = staff_user(group)
    if not may:
        with pytest.raises(PermissionDenied):
            pausing.pause(connector, user=user, via="admin", reason="receiver migrating")
        assert not AuditEntry.objects.exists()
        return
    pausing.pause(connector, user=user, via="admin", reason="receiver migrating")
    pausing.resume(connector, user=user, via="admin")
    assert list(AuditEntry.objects.order_by("at", "id").values_list("action", "username", "connector")) == [
        ("pause", group, connector.pk),
        ("resume", group, connector.pk),
    ]


def test_a_pause_is_audited_with_who_why_and_when_and_a_second_pause_is_refused(make_connector, clock):
    connector = make_connector()
    user = staff_user("operator")
    entry = pausing.pause(connector, user=user, via="api", reason="  receiver migrating ")
    connector.refresh_from_db()
    assert (connector.paused_at, connector.paused_by, connector.pause_reason) == (
        T0,
        user,
        "receiver migrating",
    )
    assert (entry.action, entry.via, entry.reason, entry.at, entry.connector) == (
        "pause",
        "api",
        "receiver migrating",
        T0,
        connector,
    )
    with pytest.raises(Refused) as refused:
        pausing.pause(connector, user=user, via="api", reason="again")
    assert refused.value.code == "already_paused"
    with pytest.raises(Refused) as refused:
        pausing.pause(make_connector("other"), user=user, via="api", reason="   ")
    assert refused.value.code == "reason_required"
    assert AuditEntry.objects.count() == 1


def test_a_staff_edit_of_a_paused_connector_keeps_its_pause(make_connector):
    connector = make_connector()
    stale = Connector.objects.get(pk=connector.pk)
    pausing.pause(connector, user=staff_user("operator"), via="admin", reason="migrating")
    stale.url = "http://127.0.0.1:9/new"
    stale.save()  # loaded before the pause: must not undo it
    connector.refresh_from_db()
    assert connector.paused_at is not None and connector.url == "http://127.0.0.1:9/new"


@pytest.mark.django_db(transaction=True)
def test_nothing_is_sent_and_no_attempt_spent_while_paused_and_resume_sends_once(
    make_connector, make_command, clock, sink
):
    queue = get_queue(QUEUE_NAME)
    queue.flush()
    connector = make_connector(url=sink.url)
    user = staff_user("operator")
    approved = make_command(connector)
    # One queued with its item before the pause, as intake leaves it: claimed, then set aside.
    queued = make_command(connector, state=State.QUEUED)
    queue.enqueue(item_payload(queued.pk, 1))
    pausing.pause(connector, user=user, via="admin", reason="receiver migrating")
    with Dispatcher(concurrency=2, per_connector=2, queue=queue) as dispatcher:
        for step in range(3):
            clock.move_to(T0 + timedelta(minutes=step))
            summary = run_round(dispatcher)
            assert summary.swept.taken == 0
        assert sink.received == [] and not Attempt.objects.exists()
        assert queue.length("main") == queue.length("busy") == 0  # no item left to churn
        for command in (approved, queued):
            command.refresh_from_db()
            assert (command.state, command.attempts) == (State.APPROVED, 0)
            said = explain(Command.objects.select_related("connector").get(pk=command.pk))
            assert (said.key, said.by, said.at) == ("paused", "person", T0)
            assert (
                said.line()
                == "its connector is paused: receiver migrating — waits for a person to resume it from 2026-09-02 09:00 UTC"
            )
        pausing.resume(connector, user=user, via="admin")
        clock.move_to(T0 + timedelta(minutes=3, seconds=1))
        run_round(dispatcher)
    assert sorted(sink.counts.values()) == [1, 1]
    assert set(Command.objects.values_list("state", flat=True)) == {State.SUCCEEDED}


# --- the API ----------------------------------------------------------------------------------------


def test_the_api_pauses_and_resumes_with_a_reason_and_shows_the_state(call, world):
    url = f"/api/v1/connectors/{world.a.connector.pk}/"
    status, data = call("operator", "POST", url + "pause/", {"reason": "receiver migrating"})
    assert status == 200 and data["sending"]["state"] == "paused"
    assert data["sending"]["reason"] == "receiver migrating"
    assert AuditEntry.objects.get(pk=data["audit"]).action == "pause"
    status, data = call("viewer", "GET", url)
    assert (status, data["sending"]["state"]) == (200, "paused")
    status, data = call("operator", "POST", url + "pause/", {"reason": "again"})
    assert (status, data["error"]) == (409, "already_paused")
    status, data = call("operator", "POST", url + "resume/", {})
    assert (status, data["sending"]) == (200, {"state": "sending", "again_in_a_row": 0})
    status, data = call("operator", "POST", url + "resume/", {})
    assert (status, data["error"]) == (409, "not_paused")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"reason": ""},
        {"reason": "   "},
        {"reason": 5},
        {"reason": ["x"]},
        {"reason": "x" * 2001},
        {"reason": "a\x00b"},
    ],
)
def test_the_api_refuses_a_pause_without_a_proper_reason_with_a_400(call, world, body):
    status, data = call("operator", "POST", f"/api/v1/connectors/{world.a.connector.pk}/pause/", body)
    assert status == 400 and isinstance(data, dict), (status, data)
    assert Connector.objects.get(pk=world.a.connector.pk).paused_at is None


@pytest.mark.parametrize(("caller", "expected"), [("anonymous", 401), ("tenant_a", 403), ("viewer", 403)])
def test_the_api_lets_only_operators_and_up_pause(call, world, caller, expected):
    status, _ = call(caller, "POST", f"/api/v1/connectors/{world.a.connector.pk}/pause/", {"reason": "x"})
    assert status == expected
    assert not AuditEntry.objects.filter(action="pause").exists()


def test_the_api_answers_404_for_a_missing_connector(call, world):
    status, data = call("operator", "POST", "/api/v1/connectors/99999999/pause/", {"reason": "x"})
    assert status == 404 and "error" in data


# --- the admin ---------------------------------------------------------------------------------------


def test_the_connector_page_offers_pause_and_the_page_pauses_with_a_reason(client, make_connector):
    connector = make_connector()
    login_as(client, "operator")
    page = client.get(reverse("admin:commands_connector_change", args=[connector.pk]))
    assert page.status_code == 200 and b'id="ankusa-pause"' in page.content
    url = reverse("admin:commands_connector_pause") + f"?ids={connector.pk}"
    assert client.get(url).status_code == 200
    assert client.post(url, {"ids": str(connector.pk), "reason": ""}).status_code == 200  # asks again
    assert Connector.objects.get(pk=connector.pk).paused_at is None
    answer = client.post(url, {"ids": str(connector.pk), "reason": "receiver migrating"})
    assert answer.status_code == 302
    connector.refresh_from_db()
    assert connector.pause_reason == "receiver migrating"
    assert AuditEntry.objects.get().via == "admin"
    page = client.get(reverse("admin:commands_connector_change", args=[connector.pk]))
    assert b'id="ankusa-resume"' in page.content and b"paused by operator" in page.content
    listing = client.get(reverse("admin:commands_connector_changelist"))
    assert b"paused by operator" in listing.content


def test_a_viewer_gets_no_pause_button_and_a_403_from_the_page(client, make_connector):
    connector = make_connector()
    login_as(client, "viewer")
    page = client.get(reverse("admin:commands_connector_change", args=[connector.pk]))
    assert page.status_code == 200 and b"ankusa-pause" not in page.content
    url = reverse("admin:commands_connector_pause") + f"?ids={connector.pk}"
    assert client.post(url, {"ids": str(connector.pk), "reason": "x"}).status_code == 403
    assert Connector.objects.get(pk=connector.pk).paused_at is None


# --- a drain that does not end ----------------------------------------------------------------------


def _queued(make_command, queue, connector) -> Command:
    command = make_command(connector, state=State.QUEUED)
    queue.enqueue(item_payload(command.pk, 1))
    return command


def _drain_in_thread(dispatcher: Dispatcher, fed: threading.Event) -> threading.Thread:
    def run():
        try:
            dispatcher.drain(fed_until=fed, max_seconds=30)
        finally:
            connections.close_all()  # this thread's own

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _hold(connector: Connector) -> None:
    Connector.objects.filter(pk=connector.pk).update(held_since=timezone.now())


def _pause(connector: Connector) -> None:
    pausing.pause(connector, user=staff_user("operator"), via="admin", reason="receiver migrating")


@pytest.mark.parametrize("stop", [_pause, _hold], ids=["paused", "held"])
@pytest.mark.django_db(transaction=True)
def test_a_drain_that_keeps_claiming_sees_a_fixed_url_and_a_stop_committed_since_it_began(
    make_connector, make_command, sink, stop
):
    # Under steady load a drain never finds the queue empty and runs until the next round (30 s by
    # default). What is committed to a connector meanwhile holds for every send claimed after it.
    queue = get_queue(QUEUE_NAME)
    queue.flush()
    connector = make_connector(url=sink.url + "/old")
    fed = threading.Event()  # until set, an empty queue does not end the drain: it waits for more
    with Dispatcher(concurrency=2, per_connector=2, queue=queue) as dispatcher:
        drain = _drain_in_thread(dispatcher, fed)
        try:
            sent = [_queued(make_command, queue, connector)]
            wait_for(lambda: len(sink.received) == 1, timeout=10, what="the first send")
            Connector.objects.filter(pk=connector.pk).update(url=sink.url + "/new")
            sent.append(_queued(make_command, queue, connector))
            wait_for(lambda: len(sink.received) == 2, timeout=10, what="the send after the fix")
            # Its success recorded first: a success recorded while a connector is held releases
            # the hold (commands.dispatch.hold), and the recorder lags the receiver.
            wait_for(
                lambda: Command.objects.get(pk=sent[1].pk).state == State.SUCCEEDED,
                timeout=10,
                what="the send after the fix to be recorded",
            )
            stop(connector)
            stopped = _queued(make_command, queue, connector)
            wait_for(
                lambda: queue.length("main") == queue.length("busy") == 0, timeout=10, what="the set-aside"
            )
        finally:
            fed.set()
            drain.join(30)
    assert [request.path for request in sink.received] == ["/receive/old", "/receive/new"]
    assert {command.state for command in Command.objects.filter(pk__in=[c.pk for c in sent])} == {
        State.SUCCEEDED
    }
    stopped.refresh_from_db()
    assert (stopped.state, stopped.attempts, Attempt.objects.filter(command=stopped).count()) == (
        State.APPROVED,
        0,
        0,
    )
