"""A database outage under a real gunicorn, on a PostgreSQL cluster of the test's own that it stops,
restarts (``-m immediate``) or cuts: webhooks, API submissions and API reads are answered JSON 503
with ``Retry-After``, never 500 — the source's configuration read behind its expired cache and the
token's check included — and a 503 says only what is known of the write."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter

import psycopg
import pytest

from tests.commands.outage import CuttingProxy, set_up
from tests.private_services import MIGRATED

pytestmark = [pytest.mark.slow]

CACHE_S = 0.3  # the source's configuration is kept this long: an outage soon outlasts it
NOTHING_STORED = "Nothing was stored (the database could not be reached); retry."
READ_FAILED = "The database did not answer; nothing was stored. Retry after the time in Retry-After."
UNKNOWN_PREFIX = (
    "The outcome is unknown: the connection to the database broke after the write was sent, so it "
    "may have been stored. "
)
UNKNOWN = UNKNOWN_PREFIX + "Retry: if it was stored, the retry is answered as a duplicate."
UNKNOWN_WITHOUT_KEY = (
    UNKNOWN_PREFIX
    + "Without an Idempotency-Key a retry may store it a second time; send one to retry safely."
)


@pytest.fixture
def site(migrated_postgres, service_env):
    return set_up(service_env, migrated_postgres.url(MIGRATED))


class Client:
    """What a provider and a REST client send to one node."""

    def __init__(self, node, token: str):
        self.node, self.token = node, token

    def hook(self, event: str):
        return self.node.hook(event, json.dumps({"event": event}).encode())

    def submit(self, key: str, *, idempotent: bool = True):
        body = json.dumps({"connector": "log", "payload": {"key": key}}).encode()
        headers = {**self.auth, "Content-Type": "application/json"}
        if idempotent:
            headers["Idempotency-Key"] = key
        return self.node.request("POST", "/api/v1/commands/", body, headers)

    def read(self, path: str):
        return self.node.request("GET", path, headers=self.auth)

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}


def assert_unavailable(answer, detail: str | None = None):
    status, data, headers = answer
    assert (status, headers.get("Content-Type"), headers.get("Retry-After")) == (
        503,
        "application/json",
        "1",
    ), answer
    assert data["error"] == "unavailable", data
    if detail is not None:
        assert data["detail"] == detail


def test_with_the_database_stopped_every_webhook_submission_and_read_is_a_json_503_with_retry_after(
    site, migrated_postgres, start_node
):
    node = start_node(
        workers=1, threads=4, DATABASE_URL=site.database_url, ANKUSA_INTAKE_CACHE_S=str(CACHE_S)
    )
    client = Client(node, site.token)
    assert client.hook("before")[0] == 202
    status, submitted, _ = client.submit("before")
    assert status == 202

    migrated_postgres.stop("immediate")
    stopped = time.monotonic()
    # The first webhook finds the source's configuration kept: its write cannot reach the database.
    assert_unavailable(client.hook("kept-route"), NOTHING_STORED)
    # Past the cache, the configuration read fails first; the token's check, the API's reads too.
    while time.monotonic() - stopped < 2 * CACHE_S:
        time.sleep(0.05)
    for n in range(3):
        assert_unavailable(client.hook(f"during-{n}"), READ_FAILED)
    assert_unavailable(client.submit("during"))
    assert_unavailable(client.read("/api/v1/commands/"))
    assert_unavailable(client.read(f"/api/v1/commands/{submitted['id']}/"))
    assert_unavailable(client.read("/api/v1/deliveries/"))

    migrated_postgres.start()
    assert client.hook("kept-route")[0] == 202
    assert client.hook("during-0")[0] == 202
    assert client.submit("during")[0] == 202
    assert client.read(f"/api/v1/commands/{submitted['id']}/")[0] == 200
    assert client.hook("before")[:2] == (200, {"status": "duplicate", "id": 1})


def test_an_immediate_restart_under_load_answers_each_webhook_202_200_or_503_never_500(
    site, migrated_postgres, start_node
):
    node = start_node(
        workers=2, threads=4, DATABASE_URL=site.database_url, ANKUSA_INTAKE_CACHE_S=str(CACHE_S)
    )
    client = Client(node, site.token)
    answers: dict[str, tuple] = {}
    stop = threading.Event()

    def provider(number: int):
        for n in itertools.count():
            if stop.is_set():
                return
            event = f"evt-{number}-{n}"
            answers[event] = client.hook(event)

    providers = [threading.Thread(target=provider, args=(number,)) for number in range(6)]
    for thread in providers:
        thread.start()
    time.sleep(0.5)
    migrated_postgres.restart("immediate")
    time.sleep(2 * CACHE_S)  # past the kept configuration: its read meets the database again
    stop.set()
    for thread in providers:
        thread.join(30)

    statuses = Counter(status for status, _, _ in answers.values())
    assert set(statuses) <= {202, 503}, statuses
    assert statuses[503] > 0, statuses  # the restart was met
    for status, data, headers in answers.values():
        if status == 503:
            assert (data["error"], headers["Retry-After"]) == ("unavailable", "1")
    # Every event is stored once: each 503 retried is accepted now, or found stored before.
    retried = Counter(client.hook(event)[0] for event, answer in answers.items() if answer[0] == 503)
    assert set(retried) <= {200, 202}, retried
    with psycopg.connect(site.database_url) as conn:
        stored = conn.execute("SELECT count(*), count(DISTINCT event_key) FROM commands_delivery").fetchone()
    assert stored == (len(answers), len(answers))


@pytest.fixture
def proxy(migrated_postgres):
    running = CuttingProxy(migrated_postgres.port)
    yield running
    running.close()


@pytest.mark.parametrize(
    "queue, stock",
    [("database", ""), ("redis", ""), ("redis", "sql")],
    ids=["database", "redis", "redis-orm"],
)
def test_a_connection_lost_while_the_commit_is_answered_is_a_503_that_says_the_outcome_is_unknown(
    site, migrated_postgres, proxy, start_node, redis_client, queue, stock
):
    through_proxy = site.database_url.replace(f":{migrated_postgres.port}/", f":{proxy.port}/")
    node = start_node(
        workers=1,
        threads=2,
        DATABASE_URL=through_proxy,
        ANKUSA_QUEUE_BACKEND=queue,
        ANKUSA_STOCK_DJANGO=stock,
    )
    client = Client(node, site.token)
    assert client.hook("before")[0] == 202
    # The write is one statement that commits by itself (the Redis queue's items follow it); the
    # ORM's (ANKUSA_STOCK_DJANGO=sql) is a transaction, whose COMMIT is the write that decides.
    proxy.cut_after(b"cut-me", b"COMMIT" if stock else None)

    assert_unavailable(client.hook("cut-me"), UNKNOWN)
    assert proxy.cuts == 1
    with psycopg.connect(site.database_url) as conn:
        (stored,) = conn.execute("SELECT id FROM commands_delivery WHERE event_key = 'cut-me'").fetchone()
    # It was stored: the retry says so, with the stored delivery's id, and stores nothing more.
    assert client.hook("cut-me")[:2] == (200, {"status": "duplicate", "id": stored})
    with psycopg.connect(site.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM commands_delivery").fetchone() == (2,)


def test_a_submission_whose_commit_answer_was_lost_says_the_outcome_is_unknown_and_how_to_retry(
    site, migrated_postgres, proxy, start_node
):
    through_proxy = site.database_url.replace(f":{migrated_postgres.port}/", f":{proxy.port}/")
    client = Client(start_node(workers=1, threads=2, DATABASE_URL=through_proxy), site.token)
    assert client.submit("before")[0] == 202

    proxy.cut_after(b"cut-me")
    assert_unavailable(client.submit("cut-me"), UNKNOWN)
    with psycopg.connect(site.database_url) as conn:
        (stored,) = conn.execute(
            "SELECT id FROM commands_command WHERE idempotency_key = 'cut-me'"
        ).fetchone()
    status, data, _ = client.submit("cut-me")
    assert (status, data["status"], data["id"]) == (200, "duplicate", stored)

    proxy.cut_after(b"no-key")
    assert_unavailable(client.submit("no-key", idempotent=False), UNKNOWN_WITHOUT_KEY)
    assert proxy.cuts == 2


def test_a_connection_lost_before_the_commit_was_sent_is_a_503_that_says_nothing_was_stored(
    site, migrated_postgres, proxy, start_node, redis_client
):
    through_proxy = site.database_url.replace(f":{migrated_postgres.port}/", f":{proxy.port}/")
    # The ORM's write is a transaction: the server answers its INSERT, and that answer is cut.
    node = start_node(
        workers=1,
        threads=2,
        DATABASE_URL=through_proxy,
        ANKUSA_QUEUE_BACKEND="redis",
        ANKUSA_STOCK_DJANGO="sql",
    )
    client = Client(node, site.token)
    assert client.hook("before")[0] == 202
    proxy.cut_after(b"cut-me")

    assert_unavailable(client.hook("cut-me"), "Nothing was stored (the database did not store it); retry.")
    assert proxy.cuts == 1
    with psycopg.connect(site.database_url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM commands_delivery WHERE event_key = 'cut-me'"
        ).fetchone() == (0,)
    assert client.hook("cut-me")[0] == 202
