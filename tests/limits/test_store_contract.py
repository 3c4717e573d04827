"""The store contract, one suite run against LocalStore and RedisStore with the same injected clock."""

from __future__ import annotations

import random

import pytest

from limits.gcra import Limit
from limits.store import Charge, Claim, Duplicate, Exceeds, LocalStore, Ok, Pending, RateLimited, Settle

HOOKS = Limit(rate=1, burst=3)  # increment 1 s, capacity 3 s
BYTES = Limit(rate=1000, burst=2000)  # increment 1 ms per byte


def hooks(tenant="acme", units=1, limit=HOOKS):
    return Charge("hooks", tenant, limit.cost_us(units), limit.capacity_us)


def body(n, tenant="acme", limit=BYTES):
    return Charge("bytes", tenant, limit.cost_us(n), limit.capacity_us)


def claim(key="evt_1", token="tok-a", command_id="cmd-1", tenant="acme", pending_ttl_ms=30_000):
    return Claim(tenant, "stripe", key, command_id, token, ttl_ms=3_600_000, pending_ttl_ms=pending_ttl_ms)


def test_a_full_bucket_admits_the_burst_and_then_says_how_long_to_wait(store):
    assert [store.hit([hooks()]) for _ in range(3)] == [
        Ok((1_000_000,)),
        Ok((2_000_000,)),
        Ok((3_000_000,)),
    ]
    assert store.hit([hooks()]) == RateLimited(1000, (3_000_000,))


def test_waiting_retry_after_admits_and_one_millisecond_less_does_not(store, clock):
    for _ in range(3):
        store.hit([hooks()])
    clock.advance(250)
    answer = store.hit([hooks()])
    assert answer == RateLimited(750, (2_750_000,))
    clock.advance(answer.retry_after_ms - 1)
    assert isinstance(store.hit([hooks()]), RateLimited)
    clock.advance(1)
    assert isinstance(store.hit([hooks()]), Ok)


def test_charges_are_all_or_nothing(store):
    assert isinstance(store.hit([body(2000)]), Ok)
    # hooks would pass, bytes would not: neither is taken.
    assert store.hit([hooks(), body(1)]) == RateLimited(1, (0, 2_000_000))
    assert [store.hit([hooks()]) for _ in range(4)][-1] == RateLimited(1000, (3_000_000,))


def test_a_charge_larger_than_the_capacity_exceeds_and_writes_nothing(store):
    assert store.hit([hooks(), body(2001)]) == Exceeds("bytes")
    assert store.hit([hooks()]) == Ok((1_000_000,))


def test_the_first_claim_of_a_key_is_ok_and_the_next_is_pending_until_settled(store, clock):
    assert store.hit([hooks()], claim()) == Ok((1_000_000,))
    clock.advance(400)
    assert store.hit([hooks()], claim(token="tok-b", command_id="cmd-2")) == Pending(29_600)
    assert store.settle(claim(), committed=True) is True
    assert store.hit([hooks()], claim(token="tok-c", command_id="cmd-3")) == Duplicate("cmd-1")


def test_a_duplicate_or_pending_claim_spends_no_charge(store):
    store.hit([hooks()], claim())
    for _ in range(5):
        assert isinstance(store.hit([hooks()], claim(token="tok-b")), Pending)
    store.settle(claim(), committed=True)
    for _ in range(5):
        assert isinstance(store.hit([hooks()], claim(token="tok-b")), Duplicate)
    assert store.hit([hooks()]) == Ok((2_000_000,))


def test_charges_are_checked_before_the_claim(store):
    store.hit([hooks()], claim())
    store.settle(claim(), committed=True)
    store.hit([hooks()])
    store.hit([hooks()])
    assert isinstance(store.hit([hooks()], claim(token="tok-b")), RateLimited)


def test_only_the_holders_token_settles_a_claim(store):
    store.hit([], claim())
    assert store.settle(claim(token="tok-x"), committed=True) is False
    assert store.settle(claim(token="tok-x"), committed=False) is False
    assert isinstance(store.hit([], claim(token="tok-b")), Pending)


def test_a_released_claim_can_be_taken_again(store):
    store.hit([], claim())
    assert store.settle(claim(), committed=False) is True
    assert store.hit([], claim(token="tok-b", command_id="cmd-2")) == Ok(())
    store.settle(claim(token="tok-b", command_id="cmd-2"), committed=True)
    assert store.hit([], claim(token="tok-c")) == Duplicate("cmd-2")


def test_a_dead_holders_claim_is_takeable_after_the_pending_ttl(store, clock):
    store.hit([], claim(pending_ttl_ms=5000))
    clock.advance(4999)
    assert store.hit([], claim(token="tok-b")) == Pending(1)
    clock.advance(1)
    assert store.hit([], claim(token="tok-b", command_id="cmd-2")) == Ok(())
    assert store.settle(claim(), committed=True) is False


def test_a_committed_claim_refuses_duplicates_for_its_ttl(store, clock):
    store.hit([], claim())
    clock.advance(10_000)
    store.settle(claim(), committed=True)
    clock.advance(3_599_999)
    assert store.hit([], claim(token="tok-b")) == Duplicate("cmd-1")
    clock.advance(1)
    assert store.hit([], claim(token="tok-b")) == Ok(())


def test_committing_may_name_the_id_a_duplicate_answers_with(store):
    store.hit([], claim(command_id="pending-1"))
    assert store.settle(claim(), committed=True, command_id="delivery-42") is True
    assert store.hit([], claim(token="tok-b")) == Duplicate("delivery-42")


def test_claims_are_scoped_by_tenant(store):
    store.hit([], claim())
    assert store.hit([], claim(tenant="other", token="tok-b")) == Ok(())


def test_reset_forgets_the_tenants_buckets_but_not_its_claims(store):
    for _ in range(3):
        store.hit([hooks(), body(600)], claim(key=f"e{_}", token=f"t{_}"))
    store.hit([hooks(tenant="other")])
    assert store.reset("acme") is True
    assert store.hit([hooks(), body(2000)]) == Ok((1_000_000, 2_000_000))
    assert store.hit([hooks(tenant="other")]) == Ok((2_000_000,))
    assert isinstance(store.hit([], claim(key="e0", token="tok-b")), Pending)


def test_a_call_may_charge_each_bucket_once(store):
    with pytest.raises(ValueError, match="once per call"):
        store.hit([hooks(), hooks()])


def test_the_same_hit_sequence_gives_identical_answers_on_both_stores(local_store, redis_store, clock):
    """Random hooks/bytes/claims/settles/resets on a shared clock: every answer must be the same."""
    rng = random.Random(20261130)
    hooks_limit, bytes_limit = Limit(rate=2.5, burst=4), Limit(rate=3000, burst=5000)
    answers = {"local": [], "redis": []}
    tokens = {}
    for step in range(600):
        clock.advance(us=rng.choice([0, 0, 137, 5_000, 90_000, 400_000, 1_300_000]))
        tenant = rng.choice(["acme", "beta"])
        charges = [hooks(tenant, limit=hooks_limit)]
        if rng.random() < 0.7:
            charges.append(body(rng.randint(1, 5200), tenant, limit=bytes_limit))
        op = rng.random()
        key = f"evt-{rng.randint(1, 12)}"
        if op < 0.6:
            token = f"tok{step}"
            tokens[(tenant, key)] = token
            made = claim(key=key, token=token, command_id=f"cmd{step}", tenant=tenant, pending_ttl_ms=2_000)
            calls = [("hit", charges, made)]
        elif op < 0.85 and tokens:
            (tenant, key), token = rng.choice(sorted(tokens.items()))
            made = claim(key=key, token=token, tenant=tenant, pending_ttl_ms=2_000)
            calls = [("settle", made, rng.random() < 0.7)]
        elif op < 0.9:
            calls = [("reset", tenant)]
        else:
            calls = [("hit", charges, None)]
        for name, target in (("local", local_store), ("redis", redis_store)):
            for call, *args in calls:
                answers[name].append(getattr(target, call)(*args))
    assert answers["local"] == answers["redis"]
    kinds = {type(answer).__name__ for answer in answers["local"]}
    assert {"Ok", "RateLimited", "Pending", "Duplicate", "Exceeds", "bool"} <= kinds


def test_the_local_store_forgets_the_earliest_claim_past_its_bound(clock):
    store = LocalStore(clock=clock, max_claims=2)
    store.hit([], claim(key="a", pending_ttl_ms=1000))
    store.hit([], claim(key="b", pending_ttl_ms=3000))
    store.hit([], claim(key="c", pending_ttl_ms=2000))
    assert store.hit([], claim(key="a", token="tok-b")) == Ok(())
    assert isinstance(store.hit([], claim(key="b", token="tok-b")), Pending)


def test_settle_many_settles_each_claim_as_settle_would_and_answers_in_order(store):
    for key in ("evt_a", "evt_b", "evt_c"):
        assert isinstance(store.hit([], claim(key=key, token=f"tok-{key}")), Ok)
    answers = store.settle_many(
        [
            Settle(claim(key="evt_a", token="tok-evt_a"), True, "101"),
            Settle(claim(key="evt_b", token="someone-else"), True, "102"),  # not the holder
            Settle(claim(key="evt_c", token="tok-evt_c"), False),
        ]
    )
    assert answers == [True, False, True]
    assert store.hit([], claim(key="evt_a", token="tok-2")) == Duplicate("101")
    assert isinstance(store.hit([], claim(key="evt_b", token="tok-2")), Pending)
    assert isinstance(store.hit([], claim(key="evt_c", token="tok-2")), Ok)  # released
    assert store.settle_many([]) == []
