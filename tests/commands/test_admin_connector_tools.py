"""The connector page's tools: "Send a test" and the signing secrets (add: shown once; drop), who
may use them, and what the page shows afterwards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.messages import get_messages
from standardwebhooks import Webhook

from commands.models import Attempt, Command, Connector
from queues.models import QueueItem
from tests.commands.staff import login_as

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


@pytest.fixture
def connector(make_connector, sink):
    return make_connector(url=sink.url)


def page(connector: Connector) -> str:
    return f"/admin/commands/connector/{connector.pk}/change/"


def tool(connector: Connector, name: str) -> str:
    return f"/admin/commands/connector/{connector.pk}/{name}/"


def test_an_operator_sees_the_tools_and_a_viewer_only_the_hints(client, connector, db):
    login_as(client, "operator")
    html = client.get(page(connector)).content.decode()
    assert 'name="ankusa-send-test"' in html and 'name="ankusa-add-secret"' in html
    assert "none: sends are not signed" in html
    client.logout()
    login_as(client, "viewer")
    html = client.get(page(connector)).content.decode()
    assert "ankusa-connector-tools" not in html
    assert "none: sends are not signed" in html


def test_send_a_test_shows_status_outlook_time_and_body_and_makes_no_command(client, connector, sink, clock):
    login_as(client, "operator")
    response = client.post(tool(connector, "send-test"))
    assert response.status_code == 200
    answer = response.context["answer"]
    assert (answer.ok, answer.status, answer.outlook, answer.excerpt) == (True, 200, "ok", '{"ok": true}')
    html = response.content.decode()
    assert (
        "HTTP 200" in html
        and "<td>ok</td>" in html
        and " ms</td>" in html
        and "{&quot;ok&quot;: true}" in html
    )
    [request] = sink.received
    assert request.json["test"] is True and request.headers["Ankusa-Test"] == "true"
    assert (Command.objects.count(), Attempt.objects.count(), QueueItem.objects.count()) == (0, 0, 0)


def test_a_second_test_within_a_second_is_refused_with_a_429(client, connector, sink, clock):
    login_as(client, "operator")
    assert client.post(tool(connector, "send-test")).status_code == 200
    response = client.post(tool(connector, "send-test"))
    assert response.status_code == 429
    assert "One test send a second per connector" in response.content.decode()
    assert len(sink.received) == 1
    clock.move_to(T0 + timedelta(seconds=1))
    assert client.post(tool(connector, "send-test")).status_code == 200


def test_an_egress_refused_test_says_after_fix_and_sends_nothing(client, connector, sink, clock, settings):
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = ()
    login_as(client, "operator")
    response = client.post(tool(connector, "send-test"))
    answer = response.context["answer"]
    assert (response.status_code, answer.ok, answer.outlook, answer.error_class) == (
        200,
        False,
        "after-fix",
        "Configuration",
    )
    assert "loopback address" in response.content.decode()
    assert sink.received == []


def test_a_log_connector_test_is_ok(client, make_connector, clock):
    login_as(client, "operator")
    log = make_connector("log", kind="log")
    answer = client.post(tool(log, "send-test")).context["answer"]
    assert (answer.ok, answer.outlook, answer.status, answer.detail) == (True, "ok", None, "logged")


def test_a_viewer_may_not_use_the_tools(client, connector, sink):
    login_as(client, "viewer")
    for name in ("send-test", "signing-secrets/add"):
        assert client.post(tool(connector, name)).status_code == 403
    assert sink.received == []
    assert Connector.objects.get(pk=connector.pk).signing_secrets == []


def test_the_tools_refuse_a_get_and_a_wrong_id(client, connector):
    login_as(client, "operator")
    assert client.get(tool(connector, "send-test")).status_code == 405
    for bad in ("999999", "abc", str(2**64), "1%00"):
        assert client.post(f"/admin/commands/connector/{bad}/send-test/").status_code == 404, bad


def test_a_new_secret_is_shown_once_then_only_its_hint(client, connector, sink, clock):
    login_as(client, "operator")
    response = client.post(tool(connector, "signing-secrets/add"))
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]  # the admin's never_cache
    secret, shown = response.context["secret"], response.context["shown"]
    assert secret.startswith("whsec_") and secret in response.content.decode()
    html = client.get(page(connector)).content.decode()
    assert shown["hint"] in html and secret[6:] not in html
    assert secret[6:] not in client.get("/admin/commands/connector/").content.decode()
    history = client.get(f"/admin/commands/connector/{connector.pk}/history/").content.decode()
    assert f"Added signing secret {shown['id']}" in history and secret[6:] not in history
    # And the test send carries its signature.
    client.post(tool(connector, "send-test"))
    [request] = sink.received
    assert Webhook(secret).verify(request.body, request.headers)["test"] is True


def test_drop_a_secret_from_the_page(client, connector):
    login_as(client, "operator")
    old = client.post(tool(connector, "signing-secrets/add")).context["shown"]
    new = client.post(tool(connector, "signing-secrets/add")).context["shown"]
    response = client.post(tool(connector, f"signing-secrets/{old['id']}/drop"))
    assert (response.status_code, response["Location"]) == (302, page(connector))
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"Dropped signing secret {old['id']} ({old['hint']}): 1 still sign."
    ]
    assert [entry["id"] for entry in Connector.objects.get(pk=connector.pk).signing_secrets] == [new["id"]]
    client.get(page(connector))  # shows (and so uses up) the message
    response = client.post(tool(connector, f"signing-secrets/{old['id']}/drop"))
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        f"The connector has no signing secret {old['id']}."
    ]


def test_a_log_connector_offers_no_signing_and_refuses_a_secret(client, make_connector):
    login_as(client, "operator")
    log = make_connector("log", kind="log")
    assert 'name="ankusa-add-secret"' not in client.get(page(log)).content.decode()
    response = client.post(tool(log, "signing-secrets/add"))
    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Only an http connector signs what it sends."
    ]


def test_saving_the_connector_form_keeps_the_signing_secrets(client, connector):
    login_as(client, "operator")
    client.post(tool(connector, "signing-secrets/add"))
    before = Connector.objects.get(pk=connector.pk).signing_secrets
    form = client.get(page(connector)).context["adminform"].form
    assert "signing_secrets" not in form.fields
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data.update(headers="{}", status_map="{}", name="renamed")
    assert client.post(page(connector), data).status_code == 302
    after = Connector.objects.get(pk=connector.pk)
    assert (after.name, after.signing_secrets) == ("renamed", before)
