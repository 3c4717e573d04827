"""What gunicorn itself refuses, before the site sees the request — a malformed request line or
header, a URI or headers too long, a transfer coding or expectation it does not take — is
answered as every other error is: JSON ``{"error", "detail"}`` under the status's own phrase,
never gunicorn's HTML page (``ankusa_site.gunicorn_conf``)."""

from __future__ import annotations

import json
import socket
from http import HTTPStatus

import pytest

from tests.servers import RawAnswer, read_to_close

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def post(head: str, body: bytes = b"") -> bytes:
    return f"POST /hooks/acme/orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode() + body


HOSTILE = {
    "malformed request line": (b"GARBAGE\r\n\r\n", 400, "bad_request"),
    "bad HTTP version": (b"GET / HTTP/9.x\r\nHost: 127.0.0.1\r\n\r\n", 400, "bad_request"),
    "header name with a space": (post("Bad Header: 1\r\nContent-Length: 0\r\n"), 400, "bad_request"),
    "two Content-Lengths": (post("Content-Length: 1\r\nContent-Length: 2\r\n", b"ab"), 400, "bad_request"),
    "coding not ending in chunked": (post("Transfer-Encoding: gzip\r\n"), 400, "bad_request"),
    "unknown transfer coding": (post("Transfer-Encoding: foo\r\n"), 501, "not_implemented"),
    "unknown expectation": (post("Expect: 100-fooo\r\nContent-Length: 0\r\n"), 417, "expectation_failed"),
    "URI too long": (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 414, "uri_too_long"),
    "header too long": (post("Idempotency-Key: " + "k" * 10_000 + "\r\n"), 431, "headers_too_large"),
    "too many headers": (post("".join(f"X-H{i}: 1\r\n" for i in range(120))), 431, "headers_too_large"),
}


def exchange(port: int, request: bytes) -> RawAnswer:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return read_to_close(sock)


@pytest.mark.parametrize("request_bytes,status,code", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_request_gunicorn_refuses_is_answered_with_a_json_error(start_node, request_bytes, status, code):
    node = start_node(workers=1, threads=2)
    answer = exchange(node.port, request_bytes)
    assert answer.status_line == f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"
    assert answer.headers["content-type"] == "application/json"
    assert int(answer.headers["content-length"]) == len(answer.body)
    error = json.loads(answer.body)
    assert error["error"] == code
    assert error["detail"]
    assert b"<html" not in answer.body
    assert node.request("GET", "/healthz", timeout=5)[0] == 200  # and the node goes on serving
