"""Slow clients cannot starve a node behind the deploy's nginx (``deploy/nginx/ankusa.conf``).

Against gunicorn alone, eight clients that trickled their headers held every thread of a node:
``/healthz`` waited out the whole run. Here 64 clients trickle their headers and 64 their bodies,
each reconnecting when nginx drops it, against real nginx in front of real gunicorn (2 workers × 4
threads, the deploy unit's shape), while one good client asks ``/healthz`` and posts signed
webhooks: every good request is answered, 99 % of them within a second, and every webhook is kept.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import uuid

import pytest

from commands.models import Connector, Delivery, Source
from limits.models import Tenant
from tests.commands.conftest import HOOK_SECRET, github_headers
from tests.site.proxy import Nginx, client_context

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HOSTILE = 64  # of each kind
RUN_S = 13.0  # longer than nginx's 10 s header deadline, so it cuts the first round of slow headers
TRICKLE_S = 0.5  # one byte per client this often: inside client_body_timeout, so bodies never end
HEADERS_FROM, BODIES_FROM = "127.0.0.2", "127.0.0.3"  # the good client comes from 127.0.0.1


class Crowd:
    """``HOSTILE`` TLS connections from ``source``, each sent ``opening`` and then one byte every
    ``TRICKLE_S``; a connection nginx closes is opened again until the crowd is stopped."""

    def __init__(self, port: int, source: str, opening: bytes):
        self.port, self.source, self.opening = port, source, opening
        self.context = client_context()
        self.opened = self.dropped = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _open(self):
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=5, source_address=(self.source, 0))
        sock = self.context.wrap_socket(raw)
        sock.sendall(self.opening)
        self.opened += 1
        return sock

    def _run(self):
        socks = [self._open() for _ in range(HOSTILE)]
        while not self.stopped.wait(TRICKLE_S):
            for i, sock in enumerate(socks):
                try:
                    sock.sendall(b"x")
                    continue
                except (OSError, ssl.SSLError):
                    self.dropped += 1
                    sock.close()
                try:
                    socks[i] = self._open()
                except OSError:
                    pass
        for sock in socks:
            sock.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(timeout=30)


def good_request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """``(status, seconds, json)`` of one request on a new TLS connection from 127.0.0.1."""
    started = time.monotonic()
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=client_context())
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        status = response.status
    except (OSError, http.client.HTTPException):
        status, raw = 0, b""
    finally:
        conn.close()
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    return status, time.monotonic() - started, data


def good_body(event: str) -> bytes:
    # Each webhook its own order: a GitHub source dedupes by body digest too (Source.dedupe_body).
    return json.dumps({"order": event, "action": "ship"}).encode()


def signed_hook(port: int):
    event = f"good-{uuid.uuid4()}"
    body = good_body(event)
    headers = {"Content-Type": "application/json", **github_headers(body, event)}
    return good_request(port, "POST", "/hooks/acme/orders/", body, headers)


@pytest.fixture
def source(db):
    tenant = Tenant.objects.create(slug="acme", name="Acme")
    source = Source.objects.create(
        tenant=tenant, slug="orders", verifier="github", verifier_secrets=[HOOK_SECRET], dedupe_key="github"
    )
    source.connectors.set([Connector.objects.create(tenant=tenant, name="log", kind="log")])
    return source


def test_slow_headers_and_slow_bodies_do_not_starve_good_clients(source, start_node, tmp_path):
    node = start_node(workers=2, threads=4, ANKUSA_TRUSTED_PROXIES="127.0.0.1")
    with Nginx(node.port, tmp_path / "nginx") as nginx:
        port = nginx.https_port
        slow_head = b"POST /hooks/acme/orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
        slow_body = (
            b"POST /hooks/acme/orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        answers = []  # (what, status, seconds)
        with Crowd(port, HEADERS_FROM, slow_head) as headers, Crowd(port, BODIES_FROM, slow_body) as bodies:
            time.sleep(1.0)  # both crowds connected and trickling before the good client starts
            deadline = time.monotonic() + RUN_S
            while time.monotonic() < deadline:
                status, seconds, _ = good_request(port, "GET", "/healthz")
                answers.append(("healthz", status, seconds))
                status, seconds, _ = signed_hook(port)
                answers.append(("hook", status, seconds))
            # A 65th request in progress from the slow bodies' address is over limit_conn: 429.
            over = signed_hook_from(port, BODIES_FROM)
        hostile = {"headers": (headers.opened, headers.dropped), "bodies": (bodies.opened, bodies.dropped)}

    statuses = {(what, status) for what, status, _ in answers}
    latencies = sorted(seconds for _, _, seconds in answers)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    print(
        f"good requests: {len(answers)}, p99 {p99 * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms, {hostile}"
    )
    assert statuses == {("healthz", 200), ("hook", 202)}
    assert p99 <= 1.0, latencies[-10:]
    hooks = sum(1 for what, _, _ in answers if what == "hook")
    assert Delivery.objects.filter(source=source).count() == hooks  # every accepted webhook was kept
    # The crowds were there all along: nginx cut every slow header at its deadline (and each came
    # back), and kept every slow body, still arriving in time, open.
    assert headers.opened >= 2 * HOSTILE and headers.dropped >= HOSTILE, hostile
    assert (bodies.opened, bodies.dropped) == (HOSTILE, 0), hostile
    assert over == (
        429,
        {
            "error": "too_many_connections",
            "detail": "Too many requests in progress from your address; retry when one has finished.",
        },
    )


def signed_hook_from(port: int, source: str):
    """``(status, json)`` of a signed webhook from ``source``, over its own TLS connection."""
    event = f"over-{uuid.uuid4()}"
    body = good_body(event)
    headers = {"Content-Type": "application/json", **github_headers(body, event)}
    raw = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    with client_context().wrap_socket(raw) as sock:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        sock.sendall(
            f"POST /hooks/acme/orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = b""
        while data := sock.recv(65536):
            answer += data
    head, _, answer_body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(answer_body)
