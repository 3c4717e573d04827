"""Admin: the change list shows each kind's effective limit and source; saving a limit resets buckets."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from limits.admission import admit
from limits.models import LimitOverride, Tenant
from limits.store import Ok, RateLimited
from tests.limits.conftest import spend_burst

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_superuser("admin", password="x"))
    return client


@pytest.fixture
def tenant():
    return Tenant.objects.create(slug="acme", name="Acme", hooks_rate=1, hooks_burst=2)


def form_data(tenant: Tenant, overrides: list[dict], initial: int = 0, **changes) -> dict:
    data = {
        "slug": tenant.slug, "name": tenant.name, "active": "on",
        "hooks_rate": tenant.hooks_rate or "", "hooks_burst": tenant.hooks_burst or "",
        "bytes_rate": "", "bytes_burst": "", "max_body_bytes": "",
        "overrides-TOTAL_FORMS": str(len(overrides)), "overrides-INITIAL_FORMS": str(initial),
        "overrides-MIN_NUM_FORMS": "0", "overrides-MAX_NUM_FORMS": "1000",
    }  # fmt: skip
    for index, override in enumerate(overrides):
        data.update({f"overrides-{index}-{key}": value for key, value in override.items()})
        data.setdefault(f"overrides-{index}-tenant", str(tenant.pk))
    data.update(changes)
    return data


def test_the_change_list_shows_each_kinds_effective_limit_and_its_source(staff_client, tenant, settings):
    settings.ANKUSA_DEFAULT_BYTES_RATE, settings.ANKUSA_DEFAULT_BYTES_BURST = 1000.0, 5000
    LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=0.5, burst=3)
    Tenant.objects.create(slug="beta", name="Beta")
    page = staff_client.get("/admin/limits/tenant/").content.decode()
    assert "0.5/s, burst 3 (override)" in page
    assert "1000/s, burst 5000 (site default)" in page
    assert page.count("(site default)") == 2


def test_the_change_list_costs_the_same_queries_for_many_tenants(staff_client, django_assert_max_num_queries):
    for n in range(40):
        tenant = Tenant.objects.create(slug=f"t{n}", name=f"T{n}", hooks_rate=1, hooks_burst=1)
        LimitOverride.objects.create(tenant=tenant, kind="bytes", rate=10, burst=10)
    with django_assert_max_num_queries(8):
        assert staff_client.get("/admin/limits/tenant/").status_code == 200


def test_saving_an_override_inline_resets_the_buckets_and_says_so(
    staff_client, tenant, django_capture_on_commit_callbacks
):
    spend_burst(tenant, 2)
    data = form_data(tenant, [{"kind": "hooks", "rate": "10", "burst": "100", "reason": "launch"}])
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(f"/admin/limits/tenant/{tenant.pk}/change/", data, follow=True)
    assert response.status_code == 200
    assert "The buckets of tenant acme were reset: its new limits apply from the next request." in (
        response.content.decode()
    )
    override = LimitOverride.objects.get()
    assert (override.rate, override.burst, override.set_by.username) == (10, 100, "admin")
    assert isinstance(admit(tenant, 0).result, Ok)


def test_deleting_an_override_inline_resets_the_buckets(
    staff_client, tenant, django_capture_on_commit_callbacks
):
    override = LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=0.001, burst=1)
    admit(tenant, 0)
    assert isinstance(admit(tenant, 0).result, RateLimited)
    data = form_data(
        tenant,
        [{"id": str(override.pk), "kind": "hooks", "rate": "0.001", "burst": "1", "DELETE": "on"}],
        initial=1,
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(f"/admin/limits/tenant/{tenant.pk}/change/", data, follow=True)
    assert "were reset" in response.content.decode()
    assert not LimitOverride.objects.exists()
    assert isinstance(admit(tenant, 0).result, Ok)


def test_an_invalid_override_is_refused_with_a_message_naming_the_field(staff_client, tenant):
    data = form_data(tenant, [{"kind": "hooks", "rate": "0", "burst": "5"}])
    response = staff_client.post(f"/admin/limits/tenant/{tenant.pk}/change/", data)
    assert response.status_code == 200
    assert "must be greater than 0." in response.content.decode()
    assert not LimitOverride.objects.exists()


def test_saving_the_tenant_without_touching_a_limit_resets_nothing(staff_client, tenant):
    response = staff_client.post(
        f"/admin/limits/tenant/{tenant.pk}/change/", form_data(tenant, [], name="Acme Inc"), follow=True
    )
    assert "were reset" not in response.content.decode()
    assert Tenant.objects.get().name == "Acme Inc"


def test_changing_the_tenants_own_limit_resets_the_buckets(
    staff_client, tenant, django_capture_on_commit_callbacks
):
    spend_burst(tenant, 2)
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(
            f"/admin/limits/tenant/{tenant.pk}/change/",
            form_data(tenant, [], hooks_rate="100", hooks_burst="1"),
            follow=True,
        )
    assert "The buckets of tenant acme were reset" in response.content.decode()
    assert isinstance(admit(Tenant.objects.get(), 0).result, Ok)
