"""Connectors reach only public addresses unless ANKUSA_CONNECTOR_ALLOWED_NETWORKS opens a network:
refused when saved (model, API, admin) and at every new connection, against the addresses the name
resolved to, connecting to the address that was checked."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from ipaddress import ip_address, ip_network

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.core.management import call_command

from commands.dispatch import adapters, event_loop
from commands.dispatch.adapters import egress, http_async
from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.rounds import run_round
from commands.lifecycle import QUEUE_NAME
from commands.models import Command, Connector
from commands.retry import Outlook
from commands.states import State
from queues.backends import get_queue

HINT = "(ANKUSA_CONNECTOR_ALLOWED_NETWORKS opens a network an installation needs)"


@pytest.fixture
def closed(settings):
    """The site's default: no network opened."""
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = ()
    return settings


@pytest.fixture
def resolver(monkeypatch):
    """A resolver the test plays: ``answers[name]`` is a list of answers, one taken per lookup."""
    answers: dict[str, list[list[str]]] = {}
    asked: list[str] = []

    def resolve(host: str, port: int):
        asked.append(host)
        found = answers[host]
        return [ip_address(a) for a in (found.pop(0) if len(found) > 1 else found[0])]

    monkeypatch.setattr(egress, "resolve", resolve)
    return answers, asked


@pytest.fixture(autouse=True)
def fresh_pool():
    """Each test gets new connections: a kept-alive one was checked under another test's rules."""
    event_loop.run(http_async.close_session())
    yield
    event_loop.run(http_async.close_session())


def refusal(url: str) -> str:
    connector = Connector(tenant_id=1, name="x", kind="http", url=url)
    with pytest.raises(ValidationError) as raised:
        connector.clean()
    return raised.value.message_dict["url"][0]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://169.254.169.254/latest/meta-data/iam/", "169.254.169.254: it is a cloud metadata address"),
        ("http://[fd00:ec2::254]/latest/", "[fd00:ec2::254]: it is a cloud metadata address"),
        (
            "http://metadata.google.internal/computeMetadata/v1/",
            "metadata.google.internal: it resolves to 169.254.169.254, a cloud metadata address",
        ),
        ("http://127.0.0.1:6379/", "127.0.0.1: it is a loopback address"),
        ("http://localhost:5432/", "localhost: it resolves to 127.0.0.1, a loopback address"),
        ("http://app.localhost/", "app.localhost: it resolves to 127.0.0.1, a loopback address"),
        ("http://[::1]:8000/", "[::1]: it is a loopback address"),
        ("http://[::ffff:127.0.0.1]/", "[::ffff:127.0.0.1]: it is a loopback address"),
        ("http://[64:ff9b::7f00:1]/", "[64:ff9b::7f00:1]: it is a loopback address"),
        ("http://[::ffff:a9fe:a9fe]/", "[::ffff:a9fe:a9fe]: it is a cloud metadata address"),
        ("http://[2002:a9fe:a9fe::]/", "[2002:a9fe:a9fe::]: it is a cloud metadata address"),
        ("http://0177.0.0.1/", "0177.0.0.1: it resolves to 127.0.0.1, a loopback address"),
        ("http://2130706433/", "2130706433: it resolves to 127.0.0.1, a loopback address"),
        ("http://LOCALHOST./", "localhost.: it resolves to 127.0.0.1, a loopback address"),
        ("http://0.0.0.0:22/", "0.0.0.0: it is an unspecified address"),
        ("http://[::]/", "[::]: it is an unspecified address"),
        ("http://10.0.0.5/", "10.0.0.5: it is a private address"),
        ("http://172.16.3.4/", "172.16.3.4: it is a private address"),
        ("http://192.168.1.1/", "192.168.1.1: it is a private address"),
        ("http://100.64.0.1/", "100.64.0.1: it is a private address"),
        ("http://[fd00::1]/", "[fd00::1]: it is a private address"),
        ("http://169.254.1.1/", "169.254.1.1: it is a link-local address"),
        ("http://[fe80::1]/", "[fe80::1]: it is a link-local address"),
        ("http://224.0.0.1/", "224.0.0.1: it is a multicast address"),
        ("http://[ff02::1]/", "[ff02::1]: it is a multicast address"),
        ("http://240.0.0.1/", "240.0.0.1: it is a reserved address"),
        ("http://192.0.2.10/", "192.0.2.10: it is a reserved address"),
        ("http://[2001:db8::1]/", "[2001:db8::1]: it is a reserved address"),
        ("http://[fec0::1]/", "[fec0::1]: it is a reserved address"),
    ],
)
def test_a_connector_to_an_inside_address_is_refused_when_saved(closed, url, message):
    assert refusal(url) == f"The connector may not reach {message} {HINT}."


@pytest.mark.parametrize("url", ["https://93.184.215.14/hook", "https://[2606:4700:4700::1111]:8443/"])
def test_a_connector_to_a_public_address_is_accepted(closed, url):
    Connector(tenant_id=1, name="x", kind="http", url=url).clean()


def test_a_name_is_refused_when_saved_if_any_address_it_resolves_to_is_inside(closed, resolver):
    answers, _ = resolver
    answers["crm.example"] = [["93.184.215.14", "10.1.2.3"]]
    assert refusal("https://crm.example/hook") == (
        f"The connector may not reach crm.example: it resolves to 10.1.2.3, a private address {HINT}."
    )


def test_a_name_that_does_not_resolve_yet_is_accepted_and_checked_at_send(closed, monkeypatch):
    def no_such_name(host, port):
        raise egress.socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(egress, "resolve", no_such_name)
    Connector(tenant_id=1, name="x", kind="http", url="https://later.example/").clean()


def test_allowed_networks_open_exactly_what_they_name(settings):
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = (ip_network("10.1.0.0/16"), ip_network("fd00::/64"))
    for url in ("http://10.1.2.3/", "http://[fd00::5]/", "http://[::ffff:10.1.0.9]/"):
        Connector(tenant_id=1, name="x", kind="http", url=url).clean()
    assert (
        refusal("http://10.2.0.1/")
        == f"The connector may not reach 10.2.0.1: it is a private address {HINT}."
    )
    assert (
        refusal("http://127.0.0.1/")
        == f"The connector may not reach 127.0.0.1: it is a loopback address {HINT}."
    )


def test_the_api_refuses_an_inside_address_on_create_and_on_change(world, call, closed):
    body = {"tenant": "acme", "name": "meta", "kind": "http", "url": "http://169.254.169.254/latest/"}
    status, data = call("admin", "POST", "/api/v1/connectors/", body)
    assert (status, data["fields"]["url"]) == (
        400,
        [f"The connector may not reach 169.254.169.254: it is a cloud metadata address {HINT}."],
    )
    connector = world.a.connector
    status, data = call(
        "operator",
        "PATCH",
        f"/api/v1/connectors/{connector.pk}/",
        {"url": "http://[::1]:8000/", "method": "PUT"},
    )
    assert (status, data["fields"]["url"]) == (
        400,
        [f"The connector may not reach [::1]: it is a loopback address {HINT}."],
    )
    connector.refresh_from_db()
    assert connector.url != "http://[::1]:8000/"


def test_the_admin_refuses_to_repoint_a_connector_inside(client, world, closed):
    client.force_login(User.objects.get(username="admin"))
    admin_client = client
    connector = world.a.connector
    page = f"/admin/commands/connector/{connector.pk}/change/"
    form = admin_client.get(page).context["adminform"].form
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data.update(url="http://127.0.0.1:6379/", method="PUT", headers="{}", status_map="{}")
    response = admin_client.post(page, data)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["url"] == [
        f"The connector may not reach 127.0.0.1: it is a loopback address {HINT}."
    ]
    connector.refresh_from_db()
    assert connector.url != "http://127.0.0.1:6379/"


# --- at send time -------------------------------------------------------------------------------


def test_a_send_to_an_inside_address_saved_before_the_rule_is_after_fix_and_sends_nothing(
    closed, make_connector, make_command, sink
):
    connector = make_connector(url=sink.url)  # created by the ORM: no validation
    outcome = adapters.send(make_command(connector))
    assert outcome == adapters.Outcome(
        ok=False,
        outlook=Outlook.AFTER_FIX,
        detail=f"the connector may not reach 127.0.0.1: it is a loopback address {HINT}",
        error_class="Configuration",
    )
    assert adapters.problems(connector) == [outcome.detail]  # what the admin shows as its problems
    assert sink.received == []


def test_a_refused_send_leaves_the_command_failed_after_fix_saying_why(
    closed, transactional_db, make_connector, make_command, sink, resolver
):
    answers, _ = resolver
    answers["inside.example"] = [["10.0.0.5"]]
    command = make_command(make_connector(url="http://inside.example:9/", idempotent=True))
    queue = get_queue(QUEUE_NAME)
    queue.flush()
    with Dispatcher(concurrency=1, per_connector=1, queue=queue) as dispatcher:
        run_round(dispatcher)
    command.refresh_from_db()
    assert (command.state, command.last_outlook, command.last_error_class, command.last_error) == (
        State.FAILED,
        "after-fix",
        "DestinationRefused",
        f"the connector may not reach inside.example: it resolves to 10.0.0.5, a private address {HINT}",
    )
    [attempt] = command.attempt_set.all()
    assert (attempt.ok, attempt.response_excerpt) == (False, "")


def test_a_send_connects_to_the_address_it_checked_not_a_second_answer(
    settings, make_connector, make_command, sink, resolver
):
    # A rebinding name: loopback (opened here) on the first lookup, the metadata address after.
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = (ip_network("127.0.0.0/8"),)
    answers, asked = resolver
    answers["rebind.example"] = [["127.0.0.1"], ["169.254.169.254"]]
    command = make_command(make_connector(url=f"http://rebind.example:{sink.port}/hook"))
    outcome = adapters.send(command)
    assert (outcome.ok, outcome.status) == (True, 200)
    assert asked == ["rebind.example"]  # resolved once, for the one connection it made
    [received] = sink.received
    assert received.headers["Host"] == f"rebind.example:{sink.port}"


def test_a_kept_alive_connection_serves_the_next_send_without_a_new_lookup(
    settings, make_connector, make_command, sink, resolver
):
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = (ip_network("127.0.0.0/8"),)
    answers, asked = resolver
    answers["kept.example"] = [["127.0.0.1"]]
    connector = make_connector(url=f"http://kept.example:{sink.port}/hook")
    assert adapters.send(make_command(connector)).ok
    assert adapters.send(make_command(connector)).ok
    assert asked == ["kept.example"]  # one connection, checked once
    assert len({r.peer for r in sink.received}) == 1


def test_one_inside_address_among_a_names_answers_refuses_the_send(
    settings, make_connector, make_command, sink, resolver
):
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = (ip_network("127.0.0.0/8"),)
    answers, _ = resolver
    answers["mixed.example"] = [["127.0.0.1", "169.254.169.254"]]
    outcome = adapters.send(make_command(make_connector(url=f"http://mixed.example:{sink.port}/")))
    assert (outcome.outlook, outcome.detail) == (
        Outlook.AFTER_FIX,
        f"the connector may not reach mixed.example: it resolves to 169.254.169.254, "
        f"a cloud metadata address {HINT}",
    )
    assert sink.received == []


def test_allowed_loopback_reaches_the_local_receiver(settings, make_connector, make_command, sink):
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = (ip_network("127.0.0.1/32"),)
    outcome = adapters.send(make_command(make_connector(url=sink.url)))
    assert (outcome.ok, len(sink.received)) == (True, 1)


# --- TLS: connected to the checked address, verified for the name --------------------------------


def _certificate(tmp_path, name: str):
    key, cert = tmp_path / f"{name}.key", tmp_path / f"{name}.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
         "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


@pytest.fixture
def tls_receiver(tmp_path):
    """An HTTPS receiver on 127.0.0.1 whose certificate names ``receiver.example``."""
    key, cert = _certificate(tmp_path, "receiver.example")
    seen: list[dict] = []
    names: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append({"host": self.headers["Host"], "sni": names[-1]})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: names.append(name)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], cert, seen
    server.shutdown()
    server.server_close()


def test_https_keeps_sni_and_the_certificate_check_for_the_name(
    settings, monkeypatch, make_connector, make_command, resolver, tls_receiver, tmp_path
):
    port, cert, seen = tls_receiver
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trust the receiver's self-signed certificate
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = (ip_network("127.0.0.0/8"),)
    answers, _ = resolver
    answers["receiver.example"] = [["127.0.0.1"]]
    answers["other.example"] = [["127.0.0.1"]]
    outcome = adapters.send(make_command(make_connector(url=f"https://receiver.example:{port}/")))
    assert (outcome.ok, seen) == (True, [{"host": f"receiver.example:{port}", "sni": "receiver.example"}])
    # The same address under another name: the certificate does not name it, so nothing is sent.
    outcome = adapters.send(make_command(make_connector("other", url=f"https://other.example:{port}/")))
    assert (outcome.ok, outcome.outlook, outcome.error_class) == (False, Outlook.AGAIN, "SSLError")
    assert "other.example" in outcome.detail
    assert len(seen) == 1


# --- connectors saved before the rule -------------------------------------------------------------


def test_manage_py_check_lists_connectors_saved_before_the_rule(closed, make_connector, capsys):
    make_connector("meta", url="http://169.254.169.254/latest/")
    make_connector("public", url="https://93.184.215.14/")
    make_connector("framing", url="https://93.184.215.14/", headers={"Content-Length": "0"})
    from commands.checks import check_connectors

    [warning] = [w for w in check_connectors(None) if w.id == "commands.W001"]
    assert warning.msg == (
        "1 connector may not reach its URL: acme/meta (the connector may not reach 169.254.169.254: "
        "it is a cloud metadata address); its sends fail as after-fix."
    )
    [headers] = [w for w in check_connectors(None) if w.id == "commands.W002"]
    assert headers.msg == ("1 connector sets headers a send leaves out: acme/framing (Content-Length).")
    call_command("check")  # warnings are reported, not raised
    assert Command.objects.count() == 0
