"""A body sent with ``Transfer-Encoding: chunked`` (no ``Content-Length``) reaches every view, through
a real gunicorn, as if it had come with its length (``ankusa_site.middleware.chunked_body``)."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from commands.models import AuditEntry, Command, Connector
from commands.states import State
from tests.servers import read_to_close

pytestmark = pytest.mark.django_db(transaction=True)


def chunked(node, token: str, method: str, path: str, body: bytes) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        pieces = (body[i : i + 7] for i in range(0, len(body), 7))
        conn.request(method, path, body=pieces, headers=headers, encode_chunked=True)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_dry_run_posted_chunked_is_a_dry_run(world, start_node):
    node = start_node(workers=1, threads=2)
    command = world.a.command
    body = json.dumps({"dry_run": True, "reason": "only a plan"}).encode()
    status, data = chunked(
        node, world.tokens["admin"], "POST", f"/api/v1/commands/{command.pk}/cancel/", body
    )
    assert status == 200, data
    assert "audit" not in data
    command.refresh_from_db()
    assert command.state == State.FAILED
    assert not AuditEntry.objects.filter(action="cancel").exclude(pk=world.audit.pk).exists()


def test_a_patch_sent_chunked_is_read_and_its_unknown_field_refused(world, start_node):
    node = start_node(workers=1, threads=2)
    path = f"/api/v1/connectors/{world.a.connector.pk}/"
    status, data = chunked(node, world.tokens["admin"], "PATCH", path, b'{"enabled": false, "no_such": 1}')
    assert (status, data["error"]) == (400, "invalid")
    status, data = chunked(node, world.tokens["admin"], "PATCH", path, b'{"enabled": false}')
    assert (status, data["enabled"]) == (200, False)
    assert Connector.objects.get(pk=world.a.connector.pk).enabled is False


def test_a_command_submitted_chunked_is_accepted(world, start_node):
    node = start_node(workers=1, threads=2)
    before = Command.objects.count()
    body = json.dumps({"connector": "billing", "payload": {"order": 7}}).encode()
    status, data = chunked(node, world.tokens["tenant_a"], "POST", "/api/v1/commands/", body)
    assert status == 202, data
    assert Command.objects.count() == before + 1


@pytest.mark.parametrize(
    ("chunks", "status", "code"),
    [
        (b"ZZ\r\n{}\r\n0\r\n\r\n", 400, "bad_request"),  # a size that is not hex
        (b"5\r\n{}\r\n", 400, "bad_request"),  # a chunk cut short
        (b"800\r\n" + b"x" * 0x800 + b"\r\n0\r\n\r\n", 413, "too_large"),  # past the site's limit
    ],
    ids=["bad-size", "cut-off", "too-large"],
)
def test_a_chunked_body_that_cannot_be_read_is_a_json_4xx(world, start_node, chunks, status, code):
    node = start_node(workers=1, threads=2, ANKUSA_MAX_REQUEST_BYTES="1024")
    head = (
        f"PATCH /api/v1/connectors/{world.a.connector.pk}/ HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {world.tokens['admin']}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
        sock.sendall(head + chunks)
        sock.shutdown(socket.SHUT_WR)
        answer = read_to_close(sock)
    assert (answer.status, json.loads(answer.body)["error"]) == (status, code)
    assert Connector.objects.get(pk=world.a.connector.pk).enabled is True
