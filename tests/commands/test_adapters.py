"""Adapters: the HTTP adapter against a real local receiver, the log adapter, and the registry."""

from __future__ import annotations

import io
import json
import logging
import socket
import threading

import pytest

from commands.dispatch import adapters
from commands.dispatch.adapters import http_async
from commands.dispatch.adapters.http import default_outlook, outlook_for
from commands.retry import Outlook
from tests.commands.sink import script


@pytest.fixture
def http_command(make_connector, make_command, sink):
    def make(payload=None, **connector_fields):
        connector_fields.setdefault("url", sink.url)
        return make_command(make_connector(**connector_fields), payload or {"order": "A-1"})

    return make


def test_registry_finds_every_adapter_module():
    assert sorted(adapters.registry()) == ["http", "log"]
    assert [kind for kind, _ in adapters.kind_choices()] == ["http", "log"]


def test_http_posts_the_payload_as_json_with_the_command_id_as_idempotency_key(http_command, sink):
    command = http_command({"order": "A-1", "qty": 2}, headers={"X-Team": "ops"})
    outcome = adapters.send(command)
    assert outcome == adapters.Outcome(ok=True, status=200, excerpt='{"ok": true}')
    [received] = sink.received
    assert received.method == "POST"
    assert received.json == {"order": "A-1", "qty": 2}
    assert received.key == str(command.pk)
    assert received.headers["Content-Type"] == "application/json"
    assert received.headers["X-Team"] == "ops"


def test_http_sends_the_credential_in_the_header_it_names(http_command, sink):
    adapters.send(http_command(secret_header="Authorization", secret="Bearer s3cret"))
    assert sink.received[0].headers["Authorization"] == "Bearer s3cret"


@pytest.mark.parametrize(
    ("status", "outlook"),
    [
        (500, Outlook.AGAIN),
        (503, Outlook.AGAIN),
        (408, Outlook.AGAIN),
        (425, Outlook.AGAIN),
        (429, Outlook.AGAIN),
        (401, Outlook.AFTER_FIX),
        (403, Outlook.AFTER_FIX),
        (407, Outlook.AFTER_FIX),
        (400, Outlook.NEVER),
        (404, Outlook.NEVER),
        (405, Outlook.NEVER),
        (410, Outlook.NEVER),
        (413, Outlook.NEVER),
        (415, Outlook.NEVER),
        (422, Outlook.NEVER),
        (409, None),
        (302, None),
        (418, None),
    ],
)
def test_http_default_outlook_by_status(http_command, sink, status, outlook):
    sink.respond = script(status)
    outcome = adapters.send(http_command())
    assert (outcome.ok, outcome.status, outcome.outlook) == (False, status, outlook)
    assert (outcome.error_class, outcome.detail) == ("HTTPStatus", f"HTTP {status}")


def test_the_receivers_retry_outlook_header_wins_over_map_and_defaults(http_command, sink):
    sink.respond = lambda request, nth: (503, {"Retry-Outlook": "never"})
    assert adapters.send(http_command(status_map={"503": "after-fix"})).outlook == Outlook.NEVER


def test_an_unknown_retry_outlook_header_falls_back_to_the_map(http_command, sink):
    sink.respond = lambda request, nth: (503, {"Retry-Outlook": "maybe"})
    assert adapters.send(http_command(status_map={"503": "after-fix"})).outlook == Outlook.AFTER_FIX


def test_the_connectors_status_map_wins_over_the_defaults(http_command, sink):
    sink.respond = script(409)
    assert adapters.send(http_command(status_map={"409": "never"})).outlook == Outlook.NEVER


def test_outlook_precedence_without_a_server():
    assert outlook_for(500, " After-Fix ", {}) == Outlook.AFTER_FIX
    assert outlook_for(500, None, {"500": "never"}) == Outlook.NEVER
    assert outlook_for(500, None, {"500": "bogus"}) == Outlook.AGAIN
    assert default_outlook(None) == Outlook.AGAIN


def test_sends_to_one_receiver_share_a_kept_alive_connection(http_command, sink):
    command = http_command()
    assert adapters.send(command).ok
    assert adapters.send(command).ok
    first, second = sink.received
    assert first.peer == second.peer  # the same client port: one connection, kept alive


def test_a_connection_the_receiver_closed_is_replaced_and_each_send_goes_out_once(
    make_connector, make_command, sink
):
    sink.respond = lambda request, nth: (200, {"Connection": "close"})
    connector = make_connector(url=sink.url)
    commands = [make_command(connector) for _ in range(3)]
    assert all(adapters.send(command).ok for command in commands)
    assert [r.key for r in sink.received] == [str(c.pk) for c in commands]
    assert len({r.peer for r in sink.received}) == 3


def test_a_refused_connection_is_again_and_names_the_error(http_command):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens once the socket closes
    outcome = adapters.send(http_command(url=f"http://127.0.0.1:{port}/"))
    assert (outcome.ok, outcome.outlook, outcome.status) == (False, Outlook.AGAIN, None)
    assert outcome.error_class == "NewConnectionError"


def test_a_receiver_that_never_answers_times_out_as_again(http_command):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    try:
        port = listener.getsockname()[1]
        outcome = adapters.send(http_command(url=f"http://127.0.0.1:{port}/", read_timeout_s=0.2))
    finally:
        listener.close()
        for conn, _ in accepted:
            conn.close()
    assert (outcome.ok, outcome.outlook, outcome.error_class) == (False, Outlook.AGAIN, "ReadTimeoutError")


def test_a_large_response_keeps_only_a_bounded_excerpt(http_command, sink):
    sink.respond = lambda request, nth: (500, {}, json.dumps({"error": "x" * 100_000}).encode())
    outcome = adapters.send(http_command())
    assert len(outcome.excerpt) == adapters.EXCERPT_CHARS
    assert outcome.excerpt.startswith('{"error": "xxx')


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"url": ""}, "no URL"),
        ({"url": "ftp://example.test/x"}, "the URL must be an absolute http:// or https:// URL"),
        ({"url": "http://user:pw@127.0.0.1/"}, "the URL carries credentials; put them in the secret instead"),
        ({"url": "http://@127.0.0.1/"}, "the URL carries credentials; put them in the secret instead"),
        ({"url": "http://127.0.0.1:99999/"}, "the URL's port is not a port (1 to 65535)"),
        ({"secret_header": "Authorization"}, "missing credential for the Authorization header"),
        ({"enabled": False}, "the connector is disabled"),
    ],
)
def test_a_configuration_problem_is_after_fix_and_nothing_is_sent(http_command, sink, fields, problem):
    outcome = adapters.send(http_command(**fields))
    assert outcome == adapters.Outcome(
        ok=False, outlook=Outlook.AFTER_FIX, detail=problem, error_class="Configuration"
    )
    assert sink.received == []


def test_an_adapter_that_raises_is_a_failure_with_no_outlook(http_command, monkeypatch):
    def broken(command):
        raise RuntimeError("bug in the adapter")

    monkeypatch.setattr(adapters.registry()["http"], "send", broken)
    outcome = adapters.send(http_command())
    assert outcome == adapters.Outcome(
        ok=False, outlook=None, detail="bug in the adapter", error_class="RuntimeError"
    )


def test_the_log_adapter_logs_the_command_without_its_payload_and_succeeds(
    make_connector, make_command, caplog
):
    command = make_command(make_connector(kind="log"), {"card": "4111"})
    with caplog.at_level(logging.INFO, logger="ankusa.connector"):
        outcome = adapters.send(command)
    assert outcome == adapters.Outcome(ok=True, detail="logged")
    [record] = caplog.records
    assert record.fields == {
        "command": command.pk,
        "tenant": command.tenant_id,
        "connector": "receiver",
        "size_bytes": 15,
    }
    assert "4111" not in caplog.text


def test_an_unknown_kind_is_a_problem(make_connector):
    connector = make_connector(kind="carrier-pigeon")
    assert adapters.problems(connector) == ["unknown connector kind 'carrier-pigeon'"]


# --- a secret or header value that cannot be sent never reaches last_error or the log ----------

UNSENDABLE = [
    ("Bearer topsecretvalue\r\nX-Evil: 1", "must be on one line (no CR or LF)"),
    ("Bearer topsecretvalue\x01", "must not hold control characters"),  # PostgreSQL stores no NUL
    ("Bearer topsecretvalue\u20ac", "may hold only Latin-1 characters"),
]


def stored_without_validation(connector, **fields):
    """What a row saved before the validation existed (or by a bulk update) may hold."""
    type(connector).objects.filter(pk=connector.pk).update(**fields)
    connector.refresh_from_db()
    return connector


@pytest.mark.parametrize(("secret", "problem"), UNSENDABLE)
def test_a_stored_secret_that_is_no_header_value_is_after_fix_naming_only_the_header(
    make_connector, make_command, sink, caplog, secret, problem
):
    connector = make_connector(url=sink.url, secret_header="Authorization", secret="Bearer ok")
    command = make_command(stored_without_validation(connector, secret=secret))
    with caplog.at_level(logging.DEBUG):
        outcome = adapters.send(command)
    assert outcome == adapters.Outcome(
        ok=False,
        outlook=Outlook.AFTER_FIX,
        detail=f"the secret for the Authorization header {problem}",
        error_class="Configuration",
    )
    assert sink.received == []
    assert "topsecretvalue" not in caplog.text


@pytest.mark.parametrize(
    ("headers", "detail"),
    [
        ({"X-Note": "a\r\nX-Evil: 1"}, "the value of the X-Note header must be on one line (no CR or LF)"),
        ({"X\r\nX-Evil": "1"}, "a header name is not a valid HTTP header name"),
    ],
    ids=["value", "name"],
)
def test_a_stored_header_that_cannot_be_sent_is_after_fix_naming_only_the_header(
    make_connector, make_command, sink, headers, detail
):
    connector = make_connector(url=sink.url)
    command = make_command(stored_without_validation(connector, headers=headers))
    outcome = adapters.send(command)
    assert (outcome.outlook, outcome.error_class, outcome.detail) == (
        Outlook.AFTER_FIX,
        "Configuration",
        detail,
    )
    assert http_async.ADAPTER.send(command) == outcome  # past the check, http.client's refusal is replaced
    assert sink.received == []


@pytest.mark.parametrize(("secret", "problem"), [UNSENDABLE[0], UNSENDABLE[2]])  # what http.client refuses
def test_the_http_adapter_itself_never_quotes_a_header_value_it_could_not_send(
    make_connector, make_command, sink, caplog, secret, problem
):
    """Defence in depth: called past the configuration check, the send's own error (http.client
    quotes the value: "Invalid header value b'Bearer …'") becomes a fixed text naming the header."""
    connector = make_connector(url=sink.url, secret_header="Authorization", secret="Bearer ok")
    command = make_command(stored_without_validation(connector, secret=secret))
    with caplog.at_level(logging.DEBUG):
        outcome = http_async.ADAPTER.send(command)
    assert outcome == adapters.Outcome(
        ok=False,
        outlook=Outlook.AFTER_FIX,
        detail=f"the value of the Authorization header {problem}",
        error_class="Configuration",
    )
    assert sink.received == []
    assert "topsecretvalue" not in caplog.text


def quoting_in_a_chain() -> RuntimeError:
    try:
        try:
            raise ValueError("b'Bearer \\xe9topsecretvalue'")
        except ValueError:
            raise RuntimeError("the adapter gave up")  # noqa: B904 - the implicit chain is the point
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(
    "error",
    [
        ValueError("Invalid header value b'Bearer \\xe9topsecretvalue'"),
        ValueError("the value was Bearer \u00e9topsecretvalue"),
        KeyError("Bearer \u00e9topsecretvalue"),
        quoting_in_a_chain(),
        UnicodeEncodeError("latin-1", "\u20ac", 0, 1, "ordinal not in range(256)"),
    ],
)
def test_an_adapter_error_quoting_the_secret_is_withheld_from_the_outcome_and_the_log(
    make_connector, make_command, monkeypatch, caplog, error
):
    connector = make_connector(
        url="http://127.0.0.1:9/", secret_header="Authorization", secret="Bearer \u00e9topsecretvalue"
    )
    command = make_command(connector)

    def broken(command):
        raise error

    monkeypatch.setattr(adapters.registry()["http"], "send", broken)
    with caplog.at_level(logging.DEBUG, logger="ankusa.commands.adapters"):
        outcome = adapters.send(command)
    name = type(error).__name__
    assert outcome == adapters.Outcome(
        ok=False,
        outlook=None,
        detail=f"{name} (message withheld: it may quote the connector's secret or a header value)",
        error_class=name,
    )
    [record] = caplog.records
    assert record.getMessage() == f"adapter http raised for command {command.pk}"
    assert "in broken" in caplog.text  # the traceback's frames are kept
    assert "topsecretvalue" not in caplog.text
    assert "\\u20ac" not in caplog.text and "\u20ac" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_dispatch_records_an_unsendable_secret_as_after_fix_without_quoting_it(
    make_connector, make_command, caplog
):
    from django.core.management import call_command

    from commands.lifecycle import QUEUE_NAME
    from commands.models import Attempt
    from queues.backends import get_queue

    get_queue(QUEUE_NAME).flush()
    connector = make_connector(url="http://127.0.0.1:1/", secret_header="Authorization", secret="Bearer ok")
    command = make_command(stored_without_validation(connector, secret="Bearer topsecretvalue\r\nX-Evil: 1"))
    with caplog.at_level(logging.DEBUG):
        call_command("dispatch", "--once", stdout=io.StringIO())
    command.refresh_from_db()
    assert (command.last_outlook, command.last_error_class, command.last_error) == (
        Outlook.AFTER_FIX,
        "Configuration",
        "the secret for the Authorization header must be on one line (no CR or LF)",
    )
    assert command.skip_reason != "outlook-unknown"
    assert [a.error_message for a in Attempt.objects.filter(command=command)] == [command.last_error]
    assert "topsecretvalue" not in caplog.text


def echo_headers(status: int):
    """A receiver that answers with the request's headers as JSON, as some debugging ones do."""
    return lambda request, nth: (status, {}, json.dumps({"headers": request.headers}).encode())


@pytest.mark.parametrize("status", [200, 401, 503])
def test_a_receiver_echoing_the_credential_has_it_masked_in_the_excerpt(http_command, sink, status):
    sink.respond = echo_headers(status)
    outcome = adapters.send(http_command(secret_header="Authorization", secret="Bearer TOPSECRET-ECHO-42"))
    assert outcome.status == status
    assert "TOPSECRET" not in outcome.excerpt
    assert '"Authorization": "[redacted]"' in outcome.excerpt
    assert '"Idempotency-Key"' in outcome.excerpt  # the rest of the answer is kept


SECRET = "Bearer abc/def+ghi&<x>"
CUT = "x" * (adapters.EXCERPT_CHARS - 10)  # what comes before the end of a cut excerpt


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        ("token was abc/def+ghi&<x>, refused", "token was [redacted], refused"),  # without its scheme
        ('{"got": "Bearer abc\\/def+ghi&<x>"}', '{"got": "[redacted]"}'),  # PHP's JSON
        ('{"got": "abc/def+ghi\\u0026\\u003cx\\u003e"}', '{"got": "[redacted]"}'),  # Go's
        ('{"got": "abc/def\\u002Bghi\\u0026\\u003Cx\\u003E"}', '{"got": "[redacted]"}'),  # .NET's
        ("q=abc%2Fdef%2Bghi%26%3Cx%3E", "q=[redacted]"),  # percent-encoded
        ("<p>abc/def+ghi&amp;&lt;x&gt;</p>", "<p>[redacted]</p>"),  # HTML-escaped
        (CUT + "Bearer abc/d", CUT + "[redacted]"),  # an excerpt cut inside the secret
        ("a short answer ends: Bearer abc/d", "a short answer ends: Bearer abc/d"),  # not cut
        ("Grizzly Bear", "Grizzly Bear"),
    ],
)
def test_masking_finds_the_secret_as_a_receiver_may_quote_it(answer, shown):
    assert adapters.masked(answer, adapters._secret_forms(SECRET)) == shown
