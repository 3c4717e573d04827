"""With the fleet store the intake answers 202 once the hook is committed and settles its claim after
the answer, batched per process (``limits.store.settling``). The seed's guarantee must hold: a claim
stays pending until the hook is durable, and a duplicate never gets a 2xx for a hook nobody stored
— here against real gunicorn workers on a real Redis, from many client threads at once."""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict

import pytest
from django.db import connection

from commands.models import Delivery
from limits import admission
from limits.store import Ok, forget_store, get_store, settling
from tests.servers import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fleet_held_settles(settings, redis_client, monkeypatch):
    """The fleet store on the tests' Redis, and a settler whose settles wait until the test runs
    them (``run_once``): the window between the answer and the settle, held open."""
    settings.ANKUSA_STORE_SCOPE = "fleet"
    forget_store()
    held = settling.SettleRetrier(background=False)
    monkeypatch.setattr(settling, "RETRIER", held)
    yield held
    forget_store()


def test_a_duplicate_while_the_settle_is_on_its_way_is_409_and_its_retry_200(
    hook_source, post_hook, fleet_held_settles, redis_client
):
    first = post_hook(delivery="evt-1")
    assert first.status_code == 202
    delivery = Delivery.objects.get()
    assert first.json()["id"] == delivery.pk  # durable before the answer
    [claim_key] = redis_client.keys("ankusa:{acme}:claim:*")
    assert redis_client.get(claim_key).startswith(b"p|")  # answered, not yet settled
    store = get_store()
    on_its_way = fleet_held_settles.take(store)  # the settler's round trip, not back yet
    assert len(on_its_way) == 1

    duplicate = post_hook(delivery="evt-1")
    assert (duplicate.status_code, duplicate.json()["error"]) == (409, "in_flight")

    assert fleet_held_settles.returned(on_its_way, store.settle_many([one.request() for one in on_its_way]))
    assert redis_client.get(claim_key).startswith(b"c|")
    retry = post_hook(delivery="evt-1")
    assert (retry.status_code, retry.json()) == (200, {"status": "duplicate", "id": delivery.pk})
    assert Delivery.objects.count() == 1


def test_the_next_request_carries_a_waiting_settle_so_a_duplicate_right_after_is_200(
    hook_source, post_hook, fleet_held_settles, redis_client
):
    first = post_hook(delivery="evt-1")
    assert fleet_held_settles.pending() == 1
    duplicate = post_hook(delivery="evt-1")  # its claim's round trip settles the first one first
    assert (duplicate.status_code, duplicate.json()) == (
        200,
        {"status": "duplicate", "id": first.json()["id"]},
    )
    assert fleet_held_settles.pending() == 0
    assert Delivery.objects.count() == 1


def test_with_settle_after_answer_off_the_claim_is_committed_before_the_202(
    hook_source, post_hook, fleet_held_settles, redis_client, settings
):
    settings.ANKUSA_SETTLE_AFTER_ANSWER = False
    first = post_hook(delivery="evt-1")
    assert first.status_code == 202
    assert fleet_held_settles.pending() == 0
    [claim_key] = redis_client.keys("ankusa:{acme}:claim:*")
    assert redis_client.get(claim_key).startswith(b"c|")
    duplicate = post_hook(delivery="evt-1")
    assert (duplicate.status_code, duplicate.json()) == (
        200,
        {"status": "duplicate", "id": first.json()["id"]},
    )


def test_settles_ride_on_the_next_claims_round_trip_and_the_rest_go_together_in_one(
    hook_source,
    post_hook,
    settings,
    start_private_redis,
    monkeypatch,
):
    server = start_private_redis()  # its counters are this test's alone
    settings.ANKUSA_STORE_SCOPE, settings.REDIS_URL = "fleet", server.url
    forget_store()
    held = settling.SettleRetrier(background=False)
    monkeypatch.setattr(settling, "RETRIER", held)
    redis = server.client()

    def reads() -> int:
        return redis.info("stats")["total_reads_processed"]

    try:
        assert post_hook(delivery="evt-warm").status_code == 202
        assert held.run_once() is True  # both scripts loaded (a first call sends its source)
        before = reads()
        for n in range(20):  # each request's claim carries the settle the one before left
            assert post_hook(delivery=f"evt-{n}").status_code == 202
        assert held.pending() == 1
        # One read of the server per webhook (its claim and the settle before it), and this INFO.
        assert reads() - before == 20 + 1

        store = get_store()
        claims = [admission.new_claim(hook_source.tenant, "x", f"key-{n}", "pending") for n in range(30)]
        assert all(isinstance(store.hit([], c), Ok) for c in claims)
        for n, claim in enumerate(claims):  # 30 answers with no request after them
            admission.settle_after_answer(claim, True, command_id=n, store=store)
        before = reads()
        assert held.run_once() is True
        assert reads() - before == 1 + 1  # 31 settles in one read, and this INFO
    finally:
        forget_store()
    assert {redis.get(k)[:2] for k in redis.keys("ankusa:{acme}:claim:*")} == {b"c|"}


def test_many_threads_sending_the_same_hooks_to_two_workers_get_2xx_only_for_stored_ones(
    hook_source, start_node, redis_client
):
    node = start_node(
        workers=2, threads=4, ANKUSA_STORE_SCOPE="fleet", ANKUSA_FLEET_BREAKER_THRESHOLD="10000"
    )
    keys = [f"evt-{n}" for n in range(30)]
    answers: dict[str, list[tuple[int, int | None, bool]]] = defaultdict(list)
    failures: list[str] = []
    lock = threading.Lock()

    def send(seed: int) -> None:
        order = keys[:]
        random.Random(seed).shuffle(order)
        try:
            for key in order:
                status, data, _ = node.hook(key)
                stored = None
                if 200 <= status < 300:
                    # Asked after the answer came: a 2xx must name a committed delivery.
                    stored = Delivery.objects.filter(pk=data["id"], event_key=key).exists()
                with lock:
                    answers[key].append((status, (data or {}).get("id"), stored))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            failures.append(repr(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert failures == []
    assert Delivery.objects.count() == len(keys)
    stored = dict(Delivery.objects.values_list("event_key", "pk"))
    for key in keys:
        statuses = Counter(status for status, _, _ in answers[key])
        assert set(statuses) <= {200, 202, 409}, (key, statuses)
        assert statuses[202] == 1, (key, statuses)
        # Every 2xx names the one stored delivery, which existed when the answer came.
        assert {(i, ok) for status, i, ok in answers[key] if status != 409} == {(stored[key], True)}
    # Every 409's retry, once the settles have landed, is a 200 duplicate of the stored one.
    wait_for(
        lambda: all(
            v.startswith(b"c|") for v in map(redis_client.get, redis_client.keys("ankusa:{acme}:claim:*"))
        ),
        timeout=10,
        what="every settle to land",
    )
    for key in keys:
        assert node.hook(key)[:2] == (200, {"status": "duplicate", "id": stored[key]})
