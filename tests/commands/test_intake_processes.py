"""Intake with real processes: gunicorn nodes sharing Redis, a holder killed between claim and commit,
Redis down during intake, and what only a real HTTP server sees (chunked bodies, huge headers)."""

from __future__ import annotations

import http.client
import json
import socket
import sqlite3
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from commands.models import Command, Delivery
from limits.models import Tenant
from queues.models import QueueItem
from tests.commands.conftest import github_headers
from tests.limits.conftest import silent_socket  # noqa: F401 - fixture
from tests.servers import MALFORMED_CHUNKS, Trickle, read_to_close, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fleet(redis_client):
    """The environment of a fleet node: the store in the tests' own Redis database."""
    return {"ANKUSA_STORE_SCOPE": "fleet", "ANKUSA_STORE_TIMEOUT_MS": "500"}


def test_two_nodes_sharing_redis_store_one_delivery_of_an_event_sent_50_times_at_once(
    hook_source, start_node, fleet
):
    nodes = [start_node(**fleet), start_node(**fleet)]
    barrier = threading.Barrier(50)

    def send(n: int):
        barrier.wait()
        return nodes[n % 2].hook("evt-1")

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(send, range(50)))

    delivery = Delivery.objects.get()
    statuses = Counter(status for status, _, _ in answers)
    assert statuses[202] == 1, statuses
    assert set(statuses) <= {202, 409, 200}, statuses
    assert all(data["id"] == delivery.pk for status, data, _ in answers if status in (200, 202))
    assert all(
        data["error"] == "in_flight" and int(h["Retry-After"]) >= 1 for s, data, h in answers if s == 409
    )
    assert Command.objects.filter(delivery=delivery).count() == 2
    # Once committed, the event is a duplicate on both nodes.
    assert [node.hook("evt-1")[:2] for node in nodes] == [
        (200, {"status": "duplicate", "id": delivery.pk})
    ] * 2


def test_two_nodes_taking_many_distinct_events_at_once_store_each_once_with_its_own_commands(
    hook_source, start_node, fleet
):
    nodes = [start_node(**fleet), start_node(**fleet)]
    barrier = threading.Barrier(32)

    def send(n: int):
        if n < 32:
            barrier.wait()
        return nodes[n % 2].hook(f"evt-{n}", json.dumps({"n": n}).encode())

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(send, range(200)))

    assert Counter(status for status, _, _ in answers) == {202: 200}
    deliveries = {d.pk: d for d in Delivery.objects.all()}
    assert len(deliveries) == 200
    for n, (_, data, _) in enumerate(answers):
        delivery = deliveries[data["id"]]
        assert (delivery.event_key, json.loads(delivery.body)) == (f"evt-{n}", {"n": n})
        commands = Command.objects.filter(pk__in=data["commands"])
        assert {(c.delivery_id, c.payload["n"]) for c in commands} == {(delivery.pk, n)}
        assert len(commands) == 2
    assert QueueItem.objects.count() == Command.objects.count() == 400


class HeldWriteLock:
    """This test holding the database's write lock on deliveries, so a node's insert waits on it."""

    def __enter__(self):
        db = settings.DATABASES["default"]
        if connection.vendor == "sqlite":
            self.conn = sqlite3.connect(db["NAME"], isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            self.conn = psycopg.connect(
                dbname=db["NAME"],
                user=db["USER"],
                password=db["PASSWORD"] or None,
                host=db["HOST"],
                port=db["PORT"],
            )
            self.conn.execute("LOCK TABLE commands_delivery IN SHARE ROW EXCLUSIVE MODE")
        return self

    def __exit__(self, *exc):
        self.conn.rollback()
        self.conn.close()


def test_a_holder_killed_between_claim_and_commit_leaves_the_retry_to_be_accepted_once(
    hook_source, start_node, fleet, redis_client
):
    pending_ttl = {**fleet, "ANKUSA_CLAIM_PENDING_TTL_MS": "1500"}
    holder, other = start_node(workers=1, **pending_ttl), start_node(**pending_ttl)
    with HeldWriteLock():
        hung = threading.Thread(target=holder.hook, args=("evt-1",))
        hung.start()
        claim_keys = wait_for(lambda: redis_client.keys("ankusa:{acme}:claim:*"), what="the holder's claim")
        claimed_at = time.monotonic()
        holder.kill()
        hung.join(10)
        assert Delivery.objects.count() == 0  # nothing stored while the write waits

    # The provider retries on another node: told to wait while the dead holder's claim is pending...
    status, data, headers = other.hook("evt-1")
    assert (status, data["error"], headers["Retry-After"] in ("1", "2")) == (409, "in_flight", True)
    # ...and answered once it has expired, as a provider's retry schedule would find it. Stored once
    # either way: on SQLite the dead holder's transaction never commits, and the retry is accepted;
    # on PostgreSQL the dead holder's write is one statement that the server finishes once the lock
    # is gone, so the retry usually finds it stored and is its duplicate (or, should the retry get
    # there first, is accepted and the dead holder's statement is refused by the unique constraint).
    status, data, _ = wait_for(
        lambda: (answer := other.hook("evt-1"))[0] != 409 and answer, what="acceptance"
    )
    assert status in ((200, 202) if connection.vendor == "postgresql" else (202,))
    assert time.monotonic() - claimed_at >= 1.0
    assert redis_client.exists(*claim_keys) == 1  # the new holder's claim, committed
    assert Delivery.objects.get().pk == data["id"]
    assert Command.objects.count() == 2
    assert other.hook("evt-1")[0] == 200


def test_with_redis_down_nodes_answer_from_local_state_and_the_database_refuses_a_cross_node_duplicate(
    hook_source,
    start_node,
    start_private_redis,
):
    redis_server = start_private_redis()
    env = {"ANKUSA_STORE_SCOPE": "fleet", "ANKUSA_STORE_TIMEOUT_MS": "50", "REDIS_URL": redis_server.url}
    a, b = start_node(**env), start_node(**env)
    assert a.hook("before")[0] == 202
    assert b.hook("before")[0] == 200  # shared through Redis

    redis_server.stop()
    timings, answers = [], []
    for n in range(20):
        started = time.monotonic()
        answers.append((a if n % 2 else b).hook(f"outage-{n}")[0])
        timings.append(time.monotonic() - started)
    assert answers == [202] * 20
    # A store that waited for Redis' own socket timeout (2 s) would show here; the budget is 50 ms.
    assert max(timings) < 1.0, timings

    # Each node claims from its own memory now: the second node's claim succeeds, its insert does not.
    assert a.hook("cross")[0] == 202
    status, data, _ = b.hook("cross")
    assert (status, data) == (200, {"status": "duplicate", "id": Delivery.objects.get(event_key="cross").pk})
    assert Delivery.objects.filter(event_key="cross").count() == 1
    assert Command.objects.filter(delivery__event_key="cross").count() == 2


def test_with_a_redis_that_never_answers_each_answer_waits_at_most_the_store_budget(
    hook_source,
    start_node,
    silent_socket,  # noqa: F811
):
    env = {"ANKUSA_STORE_SCOPE": "fleet", "ANKUSA_STORE_TIMEOUT_MS": "50", "REDIS_URL": silent_socket}
    node = start_node(workers=1, threads=2, **env)
    timings, answers = [], []
    for n in range(10):
        started = time.monotonic()
        answers.append(node.hook(f"hung-{n}")[0])
        timings.append(time.monotonic() - started)
    assert answers == [202] * 10
    # The first calls each wait out the 50 ms budget, no more (redis-py's own socket timeout would
    # be 2 s); after three failures the breaker answers from local state without asking.
    assert all(seconds >= 0.045 for seconds in timings[:3]), timings
    assert max(timings) < 1.0, timings
    assert Delivery.objects.count() == 10


def test_a_chunked_body_is_read_only_up_to_the_tenants_limit(hook_source, start_node):
    Tenant.objects.filter(pk=hook_source.tenant_id).update(max_body_bytes=1000)
    node = start_node(workers=1, threads=2)

    def chunked(body: bytes, delivery: str):
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
        try:
            headers = {"Content-Type": "application/json", **github_headers(body, delivery)}
            chunks = (body[i : i + 100] for i in range(0, len(body), 100))
            conn.request("POST", "/hooks/acme/orders/", body=chunks, headers=headers, encode_chunked=True)
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    small = b'{"order": "' + b"x" * 500 + b'"}'
    large = b'{"order": "' + b"x" * 100_000 + b'"}'
    assert chunked(small, "small")[0] == 202
    assert chunked(large, "large") == (
        413,
        {"error": "too_large", "detail": "The body is larger than this tenant's 1000 bytes."},
    )
    assert Delivery.objects.get().body == small.decode()


@pytest.mark.parametrize("chunks", MALFORMED_CHUNKS.values(), ids=MALFORMED_CHUNKS)
def test_a_malformed_chunked_body_is_a_400_json_and_stores_nothing(hook_source, start_node, chunks):
    node = start_node(workers=1, threads=2)
    status, data = send_and_close(node, "Transfer-Encoding: chunked", chunks)
    assert (status, data["error"]) == (400, "bad_request")
    assert Delivery.objects.count() == 0


def test_a_body_shorter_than_its_content_length_is_a_400_json_and_stores_nothing(hook_source, start_node):
    node = start_node(workers=1, threads=2)
    status, data = send_and_close(node, "Content-Length: 100", b"{}")
    assert (status, data) == (
        400,
        {"error": "bad_request", "detail": "The body was cut off: Content-Length is 100, 2 bytes came."},
    )
    assert Delivery.objects.count() == 0


@pytest.mark.parametrize(
    ("framing", "start"),
    [("Content-Length: 1000", b"{"), ("Transfer-Encoding: chunked", b"1000\r\n{")],
    ids=["sized", "chunked"],
)
@pytest.mark.parametrize("trickling", [False, True], ids=["stalled", "trickling"])
def test_bodies_that_never_finish_arriving_are_a_408_and_do_not_hold_the_nodes_threads(
    hook_source, start_node, framing, start, trickling
):
    node = start_node(workers=1, threads=2, ANKUSA_BODY_TIMEOUT_S="0.5")
    slow = []
    for _ in range(4):  # twice the node's threads, each waiting for the rest of its body
        sock = socket.create_connection(("127.0.0.1", node.port), timeout=30)
        sock.sendall(webhook_head(framing) + start)
        slow.append(sock)
    # Stalled: nothing more comes. Trickling: a byte every 0.1 s, each wait short, the whole never.
    with Trickle(slow if trickling else []):
        answers = [read_answer(sock) for sock in slow]
    assert (
        answers
        == [(408, {"error": "request_timeout", "detail": "The body did not arrive within 0.5 s."})] * 4
    )
    for sock in slow:  # and the server reads nothing more from them: its side is closed
        assert sock.recv(1) == b""
        sock.close()
    assert node.request("GET", "/healthz", timeout=5)[0] == 200
    assert Delivery.objects.count() == 0


def webhook_head(framing: str) -> bytes:
    """The head of a webhook signed for ``{}``, its body framed by ``framing``."""
    return (
        "POST /hooks/acme/orders/ HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{framing}\r\nConnection: close\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in github_headers(b"{}", "evt-1").items())
        + "\r\n"
    ).encode()


def read_answer(sock) -> tuple[int, dict]:
    """The status and JSON of the one answer on ``sock``, read until the server closes it."""
    answer = read_to_close(sock)
    return answer.status, json.loads(answer.body)


def send_and_close(node, framing: str, body: bytes) -> tuple[int, dict]:
    """A webhook signed for ``{}`` whose body is framed by ``framing`` and sent as ``body``, the
    client's side closed after it; the answer's status and JSON."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
        sock.sendall(webhook_head(framing) + body)
        sock.shutdown(socket.SHUT_WR)
        return read_answer(sock)


def test_headers_too_large_for_the_server_are_refused_before_django_with_a_4xx(hook_source, start_node):
    node = start_node(workers=1, threads=2)
    status, _, _ = node.hook("evt-1", **{"X-Padding": "p" * 20_000})
    many = {f"X-Pad-{n}": "p" for n in range(200)}
    assert 400 <= status < 500
    assert 400 <= node.hook("evt-2", **many)[0] < 500
    assert Delivery.objects.count() == 0
