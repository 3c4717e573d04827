"""What only the Redis store has to show: keys, TTLs, hash tags, Redis TIME, one command per hit."""

from __future__ import annotations

from django.conf import settings

from limits.gcra import Limit
from limits.store import Charge, Claim, Ok, RedisStore

HOOKS, BYTES = Limit(rate=2, burst=10), Limit(rate=1000, burst=10_000)


def charges(body=500):
    return [
        Charge("hooks", "acme", HOOKS.increment_us, HOOKS.capacity_us),
        Charge("bytes", "acme", BYTES.cost_us(body), BYTES.capacity_us),
    ]


def claim():
    return Claim("acme", "stripe", "evt_1", "cmd-1", "tok", ttl_ms=3_600_000, pending_ttl_ms=30_000)


def test_every_key_has_a_ttl_and_the_tenants_hash_tag(redis_client):
    store = RedisStore(settings.REDIS_URL, timeout_ms=1000)
    assert store.hit(charges(), claim()) == Ok((500_000, 500_000))
    keys = sorted(key.decode() for key in redis_client.keys("*"))
    assert len(keys) == 3
    assert keys[0] == "ankusa:{acme}:bytes"
    assert keys[1].startswith("ankusa:{acme}:claim:stripe:") and len(keys[1].rsplit(":", 1)[1]) == 40
    assert keys[2] == "ankusa:{acme}:hooks"
    assert 0 < redis_client.pttl(keys[0]) <= 501
    assert 29_000 < redis_client.pttl(keys[1]) <= 30_000
    assert 0 < redis_client.pttl(keys[2]) <= 501
    store.settle(claim(), committed=True)
    assert 3_599_000 < redis_client.pttl(keys[1]) <= 3_600_000


def test_buckets_hold_whole_microseconds_and_claims_their_deadline(redis_client):
    store = RedisStore(settings.REDIS_URL, timeout_ms=1000, clock=lambda: 1_800_000_000_000_000)
    store.hit(charges(), claim())
    assert redis_client.get("ankusa:{acme}:hooks") == b"1800000000500000"
    assert redis_client.get(store.claim_key(claim())) == b"p|1800000030000000|tok|cmd-1"


def test_redis_time_is_the_clock_when_none_is_injected(redis_client):
    store = RedisStore(settings.REDIS_URL, timeout_ms=1000)
    seconds, micros = redis_client.time()
    store.hit(charges())
    tat = int(redis_client.get("ankusa:{acme}:hooks"))
    assert 0 <= tat - (seconds * 1_000_000 + micros + HOOKS.increment_us) < 1_000_000


def test_a_hit_with_two_charges_and_a_claim_is_one_redis_command(private_redis):
    store = RedisStore(private_redis.url, timeout_ms=1000)
    store.hit(charges())  # loads the script
    client = private_redis.client()
    client.config_resetstat()
    store.hit(charges(), claim())
    stats = client.info("commandstats")
    assert {
        name: value["calls"] for name, value in stats.items() if not name.startswith("cmdstat_config")
    } == {
        "cmdstat_evalsha": 1,
        "cmdstat_get": 3,
        "cmdstat_set": 3,
        "cmdstat_time": 1,
    }


def test_ping_answers_true_when_redis_answers(redis_client):
    assert RedisStore(settings.REDIS_URL, timeout_ms=1000).ping() is True


def test_a_custom_prefix_keeps_the_keys_apart(redis_client):
    RedisStore(settings.REDIS_URL, timeout_ms=1000, prefix="bench-1").hit(charges())
    assert sorted(key.decode() for key in redis_client.keys("*")) == [
        "bench-1:{acme}:bytes",
        "bench-1:{acme}:hooks",
    ]
