"""A settle that misses the store's budget is retried off the request path until it lands, against a
real Redis made slow (``CLIENT PAUSE WRITE``: a timed-out call is then never applied, as with a
Redis too busy to read it) or stopped, never the shared one."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from limits.admission import settle, settle_after_answer
from limits.store import Claim, Duplicate, FleetStore, LocalStore, Ok, RedisStore, settling
from tests.servers import wait_for

BUDGET_MS = 50


def claim(key: str = "evt", token: str = "tok", pending_ttl_ms: int = 30_000) -> Claim:
    return Claim("acme", "src", key, "pending", token, ttl_ms=60_000, pending_ttl_ms=pending_ttl_ms)


def fleet_store(url: str) -> FleetStore:
    # A breaker that never opens: the settles' failures alone must not send claims to local state.
    return FleetStore(RedisStore(url, timeout_ms=BUDGET_MS), LocalStore(), threshold=10_000, cooldown_ms=1000)


class Paused:
    """Redis refusing to run writes (``CLIENT PAUSE … WRITE``), as a failover or a busy server
    would hold them: a call times out, and Redis forgets it once its client has gone."""

    def __init__(self, client):
        self.client = client

    def __enter__(self):
        self.client.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
        return self

    def __exit__(self, *exc):
        self.client.execute_command("CLIENT", "UNPAUSE")


@pytest.mark.slow
def test_commits_that_timed_out_from_several_threads_land_once_redis_runs_writes_again(private_redis):
    store = fleet_store(private_redis.url)
    redis = private_redis.client()
    claims = [claim(f"evt-{n}", f"tok-{n}") for n in range(24)]
    assert all(isinstance(store.hit([], c), Ok) for c in claims)

    with Paused(redis):
        with ThreadPoolExecutor(8) as pool:
            settled = list(pool.map(lambda c: settle(c, True, command_id=c.key[4:], store=store), claims))
        assert settled == [False] * 24  # each missed its 50 ms
        assert settling.RETRIER.pending() == 24
        keys = [store.fleet.claim_key(c) for c in claims]
        assert {redis.get(key)[:2] for key in keys} == {b"p|"}  # still pending: nothing applied

    wait_for(lambda: settling.RETRIER.pending() == 0, timeout=10, what="the settles to land")
    assert {redis.get(key)[:2] for key in keys} == {b"c|"}
    # A provider's retry of any of these events is a duplicate with its id, not "in flight".
    retry = store.hit([], claim("evt-7", "tok-retry"))
    assert retry == Duplicate("7")


@pytest.mark.slow
def test_a_release_that_timed_out_lands_and_frees_the_key_for_the_next_holder(private_redis):
    store = fleet_store(private_redis.url)
    assert isinstance(store.hit([], claim()), Ok)
    with Paused(private_redis.client()):
        assert settle(claim(), False, store=store) is False
    wait_for(lambda: settling.RETRIER.pending() == 0, timeout=10, what="the release to land")
    assert isinstance(store.hit([], claim(token="tok-next")), Ok)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_settle_is_tried_until_the_claims_pending_ttl_and_then_given_up(private_redis, caplog):
    clock = Clock()
    retrier = settling.SettleRetrier(clock=clock, background=False)
    store = RedisStore(private_redis.url, timeout_ms=BUDGET_MS)
    private_redis.stop()
    retrier.add(store, claim(pending_ttl_ms=5_000), True, "42", "timeout")
    with caplog.at_level(logging.INFO, logger="ankusa.limits"):
        assert retrier.run_once() is False  # Redis is down: it waits
        clock.now += 4.999
        assert retrier.run_once() is False
        clock.now += 0.001  # the claim has expired by itself: nothing left to settle
        assert retrier.run_once() is True
    assert retrier.pending() == 0
    assert [r.getMessage() for r in caplog.records] == ["claim_settle_retrying", "claim_settle_given_up"]


def test_a_retrier_holds_at_most_its_capacity_and_drops_what_comes_past_it(private_redis, caplog):
    retrier = settling.SettleRetrier(capacity=2, background=False)
    store = RedisStore(private_redis.url, timeout_ms=BUDGET_MS)
    with caplog.at_level(logging.WARNING, logger="ankusa.limits"):
        added = [retrier.add(store, claim(f"evt-{n}"), True, None, "timeout") for n in range(3)]
    assert added == [True, True, False]
    assert retrier.pending() == 2
    assert [r.getMessage() for r in caplog.records] == ["claim_settle_retrying"] * 2 + [
        "claim_settle_dropped"
    ]


def test_a_store_that_answers_again_empties_the_retrier_in_order(private_redis):
    retrier = settling.SettleRetrier(background=False)
    store = RedisStore(private_redis.url, timeout_ms=BUDGET_MS)
    for n in range(3):
        assert isinstance(store.hit([], claim(f"evt-{n}", f"tok-{n}")), Ok)
        retrier.add(store, claim(f"evt-{n}", f"tok-{n}"), True, str(n), "timeout")
    retrier.add(store, claim("never-claimed"), True, None, "timeout")  # answered False: moot, done
    assert retrier.run_once() is True
    assert [store.hit([], claim(f"evt-{n}", "other")) for n in range(3)] == [
        Duplicate(str(n)) for n in range(3)
    ]


def test_the_background_thread_is_started_once_per_retrier(private_redis):
    retrier = settling.SettleRetrier()
    store = RedisStore(private_redis.url, timeout_ms=BUDGET_MS)
    before = {t.ident for t in threading.enumerate() if t.name == "claim-settles"}
    for n in range(5):
        retrier.add(store, claim(f"evt-{n}"), True, None, "timeout")
    wait_for(lambda: retrier.pending() == 0, timeout=10, what="the moot settles to be done")
    after = {t.ident for t in threading.enumerate() if t.name == "claim-settles"}
    assert len(after - before) == 1


def test_a_settle_its_store_cannot_answer_holds_up_no_other(private_redis, redis_client):
    from django.conf import settings

    retrier = settling.SettleRetrier(background=False)
    dead = RedisStore(private_redis.url, timeout_ms=BUDGET_MS)
    live = RedisStore(settings.REDIS_URL, timeout_ms=BUDGET_MS)
    assert isinstance(live.hit([], claim("live")), Ok)
    private_redis.stop()
    retrier.add(dead, claim("dead"), True, "1", "timeout")
    retrier.add(live, claim("live"), True, "2", "timeout")
    assert retrier.run_once() is False  # the dead store's settle failed, and went to the back
    assert retrier.run_once() is False  # the live one landed before it failed again
    assert retrier.pending() == 1
    assert live.hit([], claim("live", "other")) == Duplicate("2")


def test_every_settle_whose_claim_expired_is_given_up_though_another_is_first_in_line(private_redis, caplog):
    clock = Clock()
    retrier = settling.SettleRetrier(clock=clock, background=False)
    store = RedisStore(private_redis.url, timeout_ms=BUDGET_MS)
    private_redis.stop()
    for n in range(3):
        retrier.add(store, claim(f"short-{n}", pending_ttl_ms=5_000), True, None, "timeout")
    retrier.add(store, claim("long", pending_ttl_ms=60_000), True, None, "timeout")
    assert retrier.run_once() is False  # short-0 failed, and went behind the long one
    clock.now += 5
    with caplog.at_level(logging.WARNING, logger="ankusa.limits"):
        assert retrier.run_once() is False
    assert retrier.pending() == 1
    given_up = [r.fields["event_key"] for r in caplog.records if r.getMessage() == "claim_settle_given_up"]
    assert sorted(given_up) == ["short-0", "short-1", "short-2"]


@pytest.mark.slow
def test_commits_after_the_answer_from_many_threads_keep_their_claims_pending_until_they_land(private_redis):
    store = fleet_store(private_redis.url)
    redis = private_redis.client()
    claims = [claim(f"evt-{n}", f"tok-{n}") for n in range(40)]
    assert all(isinstance(store.hit([], c), Ok) for c in claims)

    with Paused(redis):
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda c: settle_after_answer(c, True, command_id=c.key[4:], store=store), claims))
        # Nothing landed while Redis held writes: every claim is still pending, never a duplicate.
        keys = [store.fleet.claim_key(c) for c in claims]
        assert {redis.get(key)[:2] for key in keys} == {b"p|"}
        assert settling.RETRIER.pending() == 40

    wait_for(lambda: settling.RETRIER.pending() == 0, timeout=10, what="the settles to land")
    assert {redis.get(key)[:2] for key in keys} == {b"c|"}
    assert [store.hit([], claim(f"evt-{n}", "tok-retry")) for n in (0, 39)] == [
        Duplicate("0"),
        Duplicate("39"),
    ]
