"""Effective limits: override > tenant's own > site default > unlimited, and validation by field."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError
from django.test import override_settings
from django.utils import timezone

from limits.gcra import Limit
from limits.models import LimitOverride, Tenant
from limits.quotas import effective_limit, effective_limits, max_body_bytes

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant():
    return Tenant.objects.create(slug="acme", name="Acme", hooks_rate=5, hooks_burst=10)


def test_without_any_limit_a_kind_is_unlimited(tenant):
    with override_settings(ANKUSA_DEFAULT_BYTES_RATE=None, ANKUSA_DEFAULT_BYTES_BURST=None):
        answer = effective_limit(tenant, "bytes")
    assert (answer.limit, answer.source) == (None, "unlimited")


def test_the_site_default_applies_when_the_tenant_has_no_limit_of_its_own(tenant):
    with override_settings(ANKUSA_DEFAULT_BYTES_RATE=1000.0, ANKUSA_DEFAULT_BYTES_BURST=4000):
        answer = effective_limit(tenant, "bytes")
    assert (answer.limit, answer.source) == (Limit(1000.0, 4000), "default")


def test_the_tenants_own_limit_beats_the_site_default(tenant):
    with override_settings(ANKUSA_DEFAULT_HOOKS_RATE=1.0, ANKUSA_DEFAULT_HOOKS_BURST=1):
        answer = effective_limit(tenant, "hooks")
    assert (answer.limit, answer.source) == (Limit(5, 10), "tenant")


def test_an_active_override_beats_the_tenants_own_limit(tenant):
    override = LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=0.5, burst=2, reason="abuse")
    answer = effective_limit(tenant, "hooks")
    assert (answer.limit, answer.source, answer.override) == (Limit(0.5, 2), "override", override)
    assert answer.describe() == "0.5/s, burst 2 (override)"


def test_an_expired_override_no_longer_applies(tenant):
    now = timezone.now()
    LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=0.5, burst=2, expires_at=now)
    assert effective_limit(tenant, "hooks", now).source == "tenant"
    assert effective_limit(tenant, "hooks", now - timedelta(seconds=1)).source == "override"


def test_both_kinds_cost_one_query(tenant, django_assert_num_queries):
    with django_assert_num_queries(1):
        assert set(effective_limits(tenant)) == {"hooks", "bytes"}


def test_max_body_bytes_falls_back_to_the_site_setting(tenant):
    with override_settings(ANKUSA_MAX_BODY_BYTES=4096):
        assert max_body_bytes(tenant) == 4096
        tenant.max_body_bytes = 100
        assert max_body_bytes(tenant) == 100


@pytest.mark.parametrize(
    ("fields", "errors"),
    [
        ({"hooks_rate": 1.0}, {"hooks_burst": ["Set both hooks_rate and hooks_burst, or neither."]}),
        ({"bytes_burst": 10}, {"bytes_rate": ["Set both bytes_rate and bytes_burst, or neither."]}),
        ({"hooks_rate": 0.0, "hooks_burst": 1}, {"hooks_rate": ["must be greater than 0."]}),
        ({"bytes_rate": 2e9, "bytes_burst": 1}, {"bytes_rate": ["must be at most 1000000000 per second."]}),
        ({"hooks_rate": 0.00001, "hooks_burst": 1000}, {"hooks_burst": ["burst / rate (the refill time) must be at most one year."]}),
        ({"hooks_rate": 1.0, "hooks_burst": 0}, {"hooks_burst": ["must be at least 1."]}),
        ({"slug": "no spaces"}, {"slug": ["Use 1 to 64 letters, digits, '-' or '_'."]}),
    ],
)  # fmt: skip
def test_a_bad_tenant_limit_is_refused_naming_the_field(fields, errors):
    tenant = Tenant(**{"slug": "ok", "name": "Ok", **fields})
    with pytest.raises(ValidationError) as refused:
        tenant.full_clean()
    assert refused.value.message_dict == errors


def test_the_database_refuses_a_rate_without_a_burst():
    with pytest.raises(IntegrityError):
        Tenant.objects.create(slug="half", name="Half", hooks_rate=1.0)


def test_an_override_with_a_bad_burst_is_refused_naming_the_field(tenant):
    override = LimitOverride(tenant=tenant, kind="bytes", rate=100.0, burst=0, reason="load test")
    with pytest.raises(ValidationError) as refused:
        override.full_clean()
    assert set(refused.value.message_dict) == {"burst"}


def test_one_override_per_kind(tenant):
    LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=1, burst=1)
    with pytest.raises(IntegrityError):
        LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=2, burst=2)
