"""The site's gunicorn worker (``ankusa_site.gunicorn_worker``): a new connection goes to a worker
with a free thread, or waits in the listen queue until one is free — never to a worker whose
threads are all busy while another's are free."""

from __future__ import annotations

import socket

import pytest

from bench.intake import connections_by_worker
from tests.servers import read_to_close, wait_for

pytestmark = pytest.mark.slow


def accepted(node, count: int) -> dict[int, int] | None:
    """How many connections each of ``node``'s workers holds, once they hold ``count`` in all."""
    held = connections_by_worker(node.port, node.workers())
    return held if sum(held.values()) == count else None


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


def test_a_burst_of_new_connections_is_shared_by_the_workers(start_node):
    node = start_node(workers=2, threads=4)
    socks = [socket.create_connection(("127.0.0.1", node.port), timeout=30) for _ in range(8)]
    try:
        # Each worker takes four, a thread each waiting for its request, then stops taking any.
        held = wait_for(lambda: accepted(node, 8), timeout=4, what="the eight connections accepted")
        assert sorted(held.values()) == [4, 4]
        for sock in socks:
            sock.sendall(HEALTHZ)
        assert [read_to_close(sock).status for sock in socks] == [200] * 8
    finally:
        for sock in socks:
            sock.close()


def test_a_connection_waits_for_a_free_thread_and_is_then_served(start_node):
    node = start_node(workers=1, threads=1)
    first = socket.create_connection(("127.0.0.1", node.port), timeout=30)
    second = socket.create_connection(("127.0.0.1", node.port), timeout=30)
    try:
        # The only thread waits for the first connection's request: the second stays in the queue.
        wait_for(lambda: accepted(node, 1), timeout=4, what="the first connection accepted")
        second.sendall(HEALTHZ)
        assert sum(connections_by_worker(node.port, node.workers()).values()) == 1
        first.sendall(HEALTHZ)
        assert read_to_close(first).status == 200
        assert read_to_close(second).status == 200
    finally:
        first.close()
        second.close()
