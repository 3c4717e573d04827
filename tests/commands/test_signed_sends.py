"""Signed sends (Standard Webhooks), verified by the ``standardwebhooks`` package from PyPI as the
receiver would: real sends from the dispatcher to a real receiver (``Sink``), rotation with overlap,
and the secret shown once, never after."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.exceptions import PermissionDenied, ValidationError
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from commands import signing
from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.rounds import run_round
from commands.lifecycle import QUEUE_NAME
from commands.models import Connector
from commands.staff import connector_tools
from queues.backends import get_queue
from tests.commands.sink import script
from tests.staff import staff_user

# Sends run in worker threads with their own connections: they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


@pytest.fixture
def operator(db):
    return staff_user("operator")


@pytest.fixture
def dispatcher(db):
    queue = get_queue(QUEUE_NAME)
    queue.flush()
    with Dispatcher(concurrency=2, per_connector=2, queue=queue) as running:
        yield running


def deliver(dispatcher, make_command, connector, payload=None):
    """One command sent by a dispatch round; the receiver's request."""
    command = make_command(connector, payload or {"order": "A-1", "note": "naïve ✓"})
    run_round(dispatcher)
    command.refresh_from_db()
    assert command.state == "succeeded"
    return command


def verified(secret: str, request) -> bool:
    try:
        Webhook(secret).verify(request.body, request.headers)
    except WebhookVerificationError:
        return False
    return True


def test_a_send_of_a_signing_connector_verifies_with_its_one_secret(
    make_connector, make_command, dispatcher, clock, sink, operator
):
    connector = make_connector(url=sink.url)
    secret, shown = connector_tools.add_signing_secret(connector, by=operator)
    command = deliver(dispatcher, make_command, connector)
    [request] = sink.received
    assert verified(secret, request)
    assert Webhook(secret).verify(request.body, request.headers) == {"order": "A-1", "note": "naïve ✓"}
    assert request.headers["webhook-id"] == f"cmd_{command.pk}"
    assert request.headers["webhook-timestamp"] == str(int(T0.timestamp()))
    assert request.headers["webhook-signature"].startswith("v1,")
    assert "Ankusa-Test" not in request.headers
    assert not verified(signing.new_secret(), request)  # another secret does not


def test_with_two_active_secrets_a_receiver_holding_either_verifies(
    make_connector, make_command, dispatcher, clock, sink, operator
):
    connector = make_connector(url=sink.url)
    old, _ = connector_tools.add_signing_secret(connector, by=operator)
    new, _ = connector_tools.add_signing_secret(connector, by=operator)
    deliver(dispatcher, make_command, connector)
    [request] = sink.received
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    assert verified(old, request)
    assert verified(new, request)


def test_after_the_old_secret_is_dropped_a_receiver_holding_only_it_refuses(
    make_connector, make_command, dispatcher, clock, sink, operator
):
    connector = make_connector(url=sink.url)
    old, old_shown = connector_tools.add_signing_secret(connector, by=operator)
    new, _ = connector_tools.add_signing_secret(connector, by=operator)
    connector_tools.drop_signing_secret(connector, old_shown["id"], by=operator)
    deliver(dispatcher, make_command, connector)
    [request] = sink.received
    assert not verified(old, request)
    assert verified(new, request)
    assert len(request.headers["webhook-signature"].split(" ")) == 1


def test_dropping_the_last_secret_stops_signing(
    make_connector, make_command, dispatcher, clock, sink, operator
):
    connector = make_connector(url=sink.url)
    _, shown = connector_tools.add_signing_secret(connector, by=operator)
    connector_tools.drop_signing_secret(connector, shown["id"], by=operator)
    deliver(dispatcher, make_command, connector)
    [request] = sink.received
    assert not {"webhook-id", "webhook-timestamp", "webhook-signature"} & {h.lower() for h in request.headers}


def test_the_webhook_id_is_the_same_on_every_attempt_of_a_command(
    make_connector, make_command, dispatcher, clock, sink, operator
):
    sink.respond = script(503, 200)
    connector = make_connector(url=sink.url, idempotent=True)
    secret, _ = connector_tools.add_signing_secret(connector, by=operator)
    command = make_command(connector)
    run_round(dispatcher)
    clock.move_to(T0 + timedelta(seconds=30))  # the seed's first backoff
    run_round(dispatcher)
    command.refresh_from_db()
    assert (command.state, command.attempts) == ("succeeded", 2)
    first, second = sink.received
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == f"cmd_{command.pk}"
    assert int(second.headers["webhook-timestamp"]) - int(first.headers["webhook-timestamp"]) == 30
    assert verified(secret, first) and verified(secret, second)


def test_signatures_agree_with_the_reference_library_byte_for_byte():
    secret = signing.new_secret()
    body = b'{"a":"\\u00e9","b":[1,2]}'
    ours = signing.signature([secret], "cmd_42", 1_790_000_000, body)
    theirs = Webhook(secret).sign("cmd_42", datetime.fromtimestamp(1_790_000_000, UTC), body.decode())
    assert ours == theirs


def test_a_new_secret_is_whsec_with_32_random_bytes_and_shows_as_a_hint():
    secret = signing.new_secret()
    assert secret.startswith("whsec_")
    assert len(signing._key(secret)) == 32
    assert secret != signing.new_secret()
    assert signing.hint(secret) == f"whsec_…{secret[-4:]}"


def test_a_connector_may_not_set_the_signing_headers_itself(make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", headers={"Webhook-Signature": "v1,forged"})
    with pytest.raises(ValidationError) as refused:
        connector.full_clean()
    assert "Webhook-Signature is set by every send itself" in str(refused.value)


def test_only_an_http_connector_gets_a_signing_secret_and_at_most_five(make_connector, operator):
    log = make_connector("log", kind="log")
    with pytest.raises(ValidationError, match="Only an http connector signs"):
        connector_tools.add_signing_secret(log, by=operator)
    connector = make_connector(url="http://127.0.0.1:9/")
    for _ in range(signing.MAX_SECRETS):
        connector_tools.add_signing_secret(connector, by=operator)
    with pytest.raises(ValidationError, match="at most 5 signing secrets"):
        connector_tools.add_signing_secret(connector, by=operator)
    assert len(Connector.objects.get(pk=connector.pk).signing_secrets) == 5


def test_a_viewer_may_not_rotate(make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    with pytest.raises(PermissionDenied):
        connector_tools.add_signing_secret(connector, by=staff_user("viewer"))
    assert Connector.objects.get(pk=connector.pk).signing_secrets == []


def test_a_rotation_is_in_the_connector_history_and_the_log_without_the_secret(
    make_connector, operator, caplog
):
    from django.contrib.admin.models import LogEntry

    connector = make_connector(url="http://127.0.0.1:9/")
    with caplog.at_level(logging.INFO, logger="ankusa.commands.connector_tools"):
        secret, shown = connector_tools.add_signing_secret(connector, by=operator, via="the API")
        connector_tools.drop_signing_secret(connector, shown["id"], by=operator, via="the API")
    history = list(
        LogEntry.objects.filter(object_id=str(connector.pk))
        .order_by("pk")
        .values_list("change_message", flat=True)
    )
    assert history == [
        f"Added signing secret {shown['id']} ({shown['hint']}) (via the API)",
        f"Dropped signing secret {shown['id']} ({shown['hint']}); it no longer signs (via the API)",
    ]
    assert [r.getMessage() for r in caplog.records] == ["signing_secret_added", "signing_secret_dropped"]
    assert all(r.fields["key"] == shown["id"] for r in caplog.records)
    assert secret not in repr([r.__dict__ for r in caplog.records])
    assert secret[6:] not in " ".join(history)


def test_two_rotations_at_once_keep_both_secrets(make_connector):
    """Row lock: two operators adding at once, in two threads, keep both (PostgreSQL)."""
    import threading

    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no row lock: said in commands.staff.connector_tools")
    connector = make_connector(url="http://127.0.0.1:9/")
    people = [staff_user("operator", f"op{n}") for n in range(2)]
    start = threading.Barrier(2)

    def add(person):
        start.wait()
        try:
            connector_tools.add_signing_secret(Connector.objects.get(pk=connector.pk), by=person)
        finally:
            connection.close()

    threads = [threading.Thread(target=add, args=(person,)) for person in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(Connector.objects.get(pk=connector.pk).signing_secrets) == 2
