"""admit(): the one call the intake makes per request, and the RateLimit headers from its answer."""

from __future__ import annotations

import logging

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY

from limits import actions
from limits.admission import admit, charges_for, new_claim, settle
from limits.models import LimitOverride, Tenant
from limits.store import (
    Charge,
    Duplicate,
    Exceeds,
    LocalStore,
    Ok,
    Pending,
    RateLimited,
    RedisStore,
    get_store,
)

pytestmark = pytest.mark.django_db

NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens: a store call there would answer Error


@pytest.fixture
def tenant():
    return Tenant.objects.create(
        slug="acme", name="Acme", hooks_rate=2, hooks_burst=3, bytes_rate=1000, bytes_burst=5000
    )


def test_a_request_costs_one_hook_and_its_body_length_in_bytes(tenant):
    charges, limits = charges_for(tenant, 1200)
    assert charges == [
        Charge("hooks", "acme", 500_000, 1_500_000),
        Charge("bytes", "acme", 1_200_000, 5_000_000),
    ]
    assert [limit.burst for limit in limits] == [3, 5000]


def test_a_body_over_the_tenants_maximum_exceeds_without_a_store_call(tenant):
    tenant.max_body_bytes = 100
    assert admit(tenant, 101, store=RedisStore(NOWHERE, timeout_ms=50)).result == Exceeds("max_body_bytes")


def test_a_body_larger_than_the_whole_bytes_burst_exceeds_without_a_store_call(tenant):
    assert admit(tenant, 5001, store=RedisStore(NOWHERE, timeout_ms=50)).result == Exceeds("bytes")


def test_an_unlimited_tenant_without_a_claim_needs_no_store_call():
    free = Tenant.objects.create(slug="free", name="Free")
    with override_settings(ANKUSA_DEFAULT_HOOKS_RATE=None, ANKUSA_DEFAULT_HOOKS_BURST=None):
        decision = admit(free, 10, store=RedisStore(NOWHERE, timeout_ms=50))
    assert decision.result == Ok()
    assert decision.headers() == {}


def test_the_ratelimit_headers_come_from_the_same_answer(tenant, local_store):
    store = local_store
    decision = admit(tenant, 1000, store=store)
    assert isinstance(decision.result, Ok)
    assert decision.headers() == {
        "RateLimit-Policy": '"hooks";q=3;w=2, "bytes";q=5000;w=5',
        "RateLimit": '"hooks";r=2;t=1, "bytes";r=4000;t=1',
    }


def test_a_rate_limited_request_says_how_long_and_that_nothing_remains(tenant, local_store):
    # The clock stands still: three hits fill the burst, the fourth waits one increment (0.5 s).
    store = local_store
    for _ in range(3):
        admit(tenant, 10, store=store)
    decision = admit(tenant, 10, store=store)
    assert isinstance(decision.result, RateLimited)
    assert decision.result.retry_after_ms == 500
    assert decision.headers()["RateLimit"].startswith('"hooks";r=0;t=2, ')


def test_a_claim_is_pending_until_settled_then_a_duplicate(tenant):
    store = LocalStore()
    first = new_claim(tenant, "src-1", "evt_1", "cmd-1")
    assert isinstance(admit(tenant, 10, first, store=store).result, Ok)
    second = new_claim(tenant, "src-1", "evt_1", "cmd-2")
    assert isinstance(admit(tenant, 10, second, store=store).result, Pending)
    assert settle(first, committed=True, store=store) is True
    assert admit(tenant, 10, second, store=store).result == Duplicate("cmd-1")


def test_a_new_claim_takes_the_ttls_from_the_settings_and_a_fresh_token(tenant):
    with override_settings(ANKUSA_CLAIM_TTL_MS=9_000_000, ANKUSA_CLAIM_PENDING_TTL_MS=7_000):
        one, two = new_claim(tenant, 4, "k", 17), new_claim(tenant, 4, "k", 18)
    assert (one.tenant, one.source_id, one.command_id, one.ttl_ms, one.pending_ttl_ms) == (
        "acme", "4", "17", 9_000_000, 7_000,
    )  # fmt: skip
    assert one.token != two.token


def test_settling_a_claim_no_longer_held_is_logged(tenant, caplog):
    claim = new_claim(tenant, "src-1", "evt_9", "cmd-9")
    with caplog.at_level(logging.WARNING, logger="ankusa.limits"):
        assert settle(claim, committed=True, store=LocalStore()) is False
    [record] = caplog.records
    assert (record.getMessage(), record.fields) == (
        "claim_settle_failed",
        {
            "action": "commit", "tenant": "acme", "source": "src-1", "event_key": "evt_9",
            "reason": "no longer held by this token",
        },
    )  # fmt: skip


def test_setting_an_override_resets_the_tenants_buckets(tenant, django_capture_on_commit_callbacks):
    for _ in range(3):
        admit(tenant, 10)
    assert isinstance(admit(tenant, 10).result, RateLimited)
    with django_capture_on_commit_callbacks(execute=True):
        actions.set_override(tenant, "hooks", rate=1, burst=10, reason="launch day")
    decision = admit(tenant, 10)
    assert isinstance(decision.result, Ok)
    assert decision.headers()["RateLimit-Policy"].startswith('"hooks";q=10;w=10')


def test_removing_an_override_resets_the_tenants_buckets(tenant, django_capture_on_commit_callbacks):
    LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=0.001, burst=1)
    assert isinstance(admit(tenant, 10).result, Ok)
    assert isinstance(admit(tenant, 10).result, RateLimited)
    with django_capture_on_commit_callbacks(execute=True):
        assert actions.remove_override(tenant, "hooks") is True
    assert isinstance(admit(tenant, 10).result, Ok)
    assert actions.remove_override(tenant, "hooks") is False


def test_a_reset_the_store_cannot_make_is_logged_not_raised(tenant, caplog):
    with override_settings(ANKUSA_STORE_SCOPE="fleet", REDIS_URL=NOWHERE):
        with caplog.at_level(logging.WARNING, logger="ankusa.limits"):
            assert actions.reset_buckets(tenant) is False
    [record] = caplog.records
    assert record.getMessage() == "bucket_reset_failed"
    assert record.fields["tenant"] == "acme"
    assert record.fields["reason"].startswith("unreachable: ConnectionRefusedError")


def test_the_store_is_one_per_process_and_follows_the_settings():
    assert get_store() is get_store()
    assert isinstance(get_store(), LocalStore)
    with override_settings(ANKUSA_STORE_SCOPE="fleet", REDIS_URL=NOWHERE):
        assert type(get_store()).__name__ == "FleetStore"
    assert isinstance(get_store(), LocalStore)


def test_every_store_answer_is_counted_by_scope_and_result(tenant, local_store):
    labels = {"scope": "node", "result": "ratelimited"}
    before = REGISTRY.get_sample_value("ankusa_store_calls_total", labels) or 0
    for _ in range(4):
        admit(tenant, 10, store=local_store)
    assert REGISTRY.get_sample_value("ankusa_store_calls_total", labels) == before + 1
