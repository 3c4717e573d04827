"""``ANKUSA_BODY_TIMEOUT_S`` on every path (``ankusa_site.core.middleware``): a client that sends its
headers and then not all of its body gives up its thread once the time is out, whatever it asked
for. (The intake's own answers, 408 ``request_timeout``, are in tests/commands/test_intake_processes.py.)"""

from __future__ import annotations

import json
import socket

import pytest

from limits.models import Tenant
from tests.servers import Trickle, read_to_close
from tests.staff import staff_user, token_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


CSRF_COOKIE = "csrftoken=" + "a" * 32


def head(method: str, path: str, content_type: str, length: int, **headers: str) -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + "\r\n"
    ).encode()


@pytest.mark.parametrize("trickling", [False, True], ids=["stalled", "trickling"])
def test_an_admin_form_whose_body_never_arrives_is_refused_and_frees_its_thread(start_node, trickling):
    node = start_node(workers=1, threads=2, ANKUSA_BODY_TIMEOUT_S="0.5")
    slow = []
    for _ in range(4):  # twice the node's threads
        sock = socket.create_connection(("127.0.0.1", node.port), timeout=30)
        # With a well-formed CSRF cookie, Django's CSRF check reads the form for its token (without
        # one it answers 403 before reading anything, and the body would never be waited for).
        form = head("POST", "/admin/login/", "application/x-www-form-urlencoded", 1000, Cookie=CSRF_COOKIE)
        sock.sendall(form + b"username=")
        slow.append(sock)
    # The form cut at its deadline holds no token: 403.
    with Trickle(slow if trickling else []):
        assert [read_to_close(sock).status for sock in slow] == [403] * 4
    for sock in slow:
        sock.close()
    assert node.request("GET", "/healthz", timeout=5)[0] == 200


@pytest.mark.parametrize("trickling", [False, True], ids=["stalled", "trickling"])
def test_an_api_write_whose_body_never_arrives_is_a_408_json_and_frees_its_thread(start_node, trickling):
    Tenant.objects.create(slug="acme", name="Acme")
    token = token_for(staff_user("admin"))
    node = start_node(workers=1, threads=2, ANKUSA_BODY_TIMEOUT_S="0.5")
    slow = []
    for _ in range(4):  # twice the node's threads, each authenticated, each stalled mid-body
        sock = socket.create_connection(("127.0.0.1", node.port), timeout=30)
        sock.sendall(
            head("PATCH", "/api/v1/tenants/acme/", "application/json", 1000, Authorization=f"Bearer {token}")
            + b'{"name": '
        )
        slow.append(sock)
    with Trickle(slow if trickling else []):
        answers = [read_to_close(sock) for sock in slow]
    for answer in answers:
        assert (answer.status, json.loads(answer.body)) == (
            408,
            {"error": "request_timeout", "detail": "The body did not arrive within 0.5 s."},
        )
    for sock in slow:
        sock.close()
    assert node.request("GET", "/healthz", timeout=5)[0] == 200
    assert Tenant.objects.get().name == "Acme"
