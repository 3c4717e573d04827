"""A body sent with ``Transfer-Encoding: chunked`` (no ``Content-Length``), through a real gunicorn:
read by the two views that read one themselves (a command's submission, a webhook), a 411 with
nothing done anywhere else (``ankusa_site.core.middleware.chunked_body``), never parsed as empty."""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from commands.models import AuditEntry, Command, Connector
from commands.states import State
from tests.servers import MALFORMED_CHUNKS, read_to_close

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


def test_a_cancel_posted_chunked_is_a_411_and_cancels_nothing(world, start_node):
    node = start_node(workers=1, threads=2)
    command = world.a.command
    body = json.dumps({"dry_run": True, "reason": "only a plan"}).encode()
    status, data = chunked(
        node, world.tokens["admin"], "POST", f"/api/v1/commands/{command.pk}/cancel/", body
    )
    assert (status, data["error"]) == (411, "length_required")
    command.refresh_from_db()
    assert command.state == State.FAILED
    assert not AuditEntry.objects.exclude(pk=world.audit.pk).exists()


def test_a_patch_sent_chunked_is_a_411_and_changes_nothing(world, start_node):
    node = start_node(workers=1, threads=2)
    path = f"/api/v1/connectors/{world.a.connector.pk}/"
    status, data = chunked(node, world.tokens["admin"], "PATCH", path, b'{"enabled": false}')
    assert (status, data["error"]) == (411, "length_required")
    assert Connector.objects.get(pk=world.a.connector.pk).enabled is True


def test_a_command_submitted_chunked_is_read_and_accepted(world, start_node):
    node = start_node(workers=1, threads=2)
    before = Command.objects.count()
    body = json.dumps({"connector": "billing", "payload": {"order": 7}}).encode()
    status, data = chunked(node, world.tokens["tenant_a"], "POST", "/api/v1/commands/", body)
    assert status == 202, data
    assert Command.objects.count() == before + 1


@pytest.mark.parametrize("chunks", MALFORMED_CHUNKS.values(), ids=MALFORMED_CHUNKS)
def test_a_malformed_chunked_submission_is_a_400_json_and_stores_nothing(world, start_node, chunks):
    node = start_node(workers=1, threads=2)
    before = Command.objects.count()
    head = (
        "POST /api/v1/commands/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {world.tokens['tenant_a']}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
        sock.sendall(head + chunks)
        sock.shutdown(socket.SHUT_WR)
        answer = read_to_close(sock)
    assert (answer.status, json.loads(answer.body)["error"]) == (400, "bad_request")
    assert Command.objects.count() == before
