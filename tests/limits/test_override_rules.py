"""A limit override needs a reason and an expiry still ahead, whichever door sets it; the API's
changes show in the tenant's admin history; the tenant's page says where a limit is counted
(items 7 and 20 of issue 22)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.utils import timezone

from limits.models import LimitOverride, Tenant
from tests.limits.test_admin import form_data
from tests.staff import api_client, staff_user

pytestmark = pytest.mark.django_db
PAGE = "/admin/limits/tenant/{}/change/"
REASON_RULE = "Say why the override is needed: it is kept with it and in the history."


@pytest.fixture
def staff_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="x"))
    return client


@pytest.fixture
def tenant():
    return Tenant.objects.create(slug="acme", name="Acme", hooks_rate=1, hooks_burst=2)


def inline(**fields) -> dict:
    return {"kind": "hooks", "rate": "5", "burst": "10", "reason": "launch", "expires_at_0": "",
            "expires_at_1": "", **fields}  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reason": ""}, REASON_RULE),
        ({"reason": "   "}, REASON_RULE),
        (
            {"expires_at_0": "2001-01-01", "expires_at_1": "00:00:00"},
            "Must be in the future (empty: until removed).",
        ),
    ],
)
def test_the_admin_refuses_an_override_without_a_reason_or_with_a_past_expiry(
    staff_client, tenant, fields, message
):
    page = staff_client.post(PAGE.format(tenant.pk), form_data(tenant, [inline(**fields)]))
    assert page.status_code == 200
    assert message in page.content.decode()
    assert not LimitOverride.objects.exists()


def test_the_model_refuses_them_for_every_door(tenant):
    for fields in ({"reason": ""}, {"reason": "x", "expires_at": timezone.now() - timedelta(seconds=1)}):
        with pytest.raises(ValidationError) as refused:
            LimitOverride(tenant=tenant, kind="hooks", rate=1, burst=1, **fields).full_clean()
        assert set(refused.value.message_dict) == (
            {"reason"} if "expires_at" not in fields else {"expires_at"}
        )


def test_an_override_that_expired_since_does_not_block_saving_its_tenant(staff_client, tenant):
    old = LimitOverride.objects.create(
        tenant=tenant,
        kind="hooks",
        rate=5,
        burst=10,
        reason="",
        expires_at=timezone.now() - timedelta(days=1),
    )
    stored = timezone.localtime(old.expires_at)
    unchanged = inline(id=str(old.pk), reason="", expires_at_0=f"{stored:%Y-%m-%d}",
                       expires_at_1=f"{stored:%H:%M:%S}")  # fmt: skip
    LimitOverride.objects.filter(pk=old.pk).update(expires_at=stored.replace(microsecond=0))
    response = staff_client.post(
        PAGE.format(tenant.pk), form_data(tenant, [unchanged], initial=1, name="Acme Co")
    )
    assert response.status_code == 302
    tenant.refresh_from_db()
    assert tenant.name == "Acme Co"


def test_an_override_set_and_removed_through_the_api_shows_in_the_tenants_admin_history(staff_client, tenant):
    admin = api_client(staff_user("admin"))
    url = "/api/v1/tenants/acme/limits/hooks/"
    body = {"rate": 5, "burst": 10, "reason": "launch day", "expires_at": "2099-01-01T00:00:00Z"}
    assert admin.put(url, body, format="json").status_code == 201
    assert admin.delete(url).status_code == 204
    entries = LogEntry.objects.filter(object_id=str(tenant.pk)).order_by("pk")
    assert [(e.user.username, e.get_change_message()) for e in entries] == [
        (
            "admin",
            "Added the hooks override: 5/s, burst 10 until 2099-01-01 00:00 UTC — launch day (via the API)",
        ),
        ("admin", "Removed the hooks override. (via the API)"),
    ]
    history = staff_client.get(f"/admin/limits/tenant/{tenant.pk}/history/").content.decode()
    assert "Added the hooks override: 5/s, burst 10" in history and "Removed the hooks override." in history


def test_the_tenant_page_says_a_node_scope_limit_is_per_process(staff_client, tenant, settings):
    settings.ANKUSA_STORE_SCOPE = "node"
    page = staff_client.get(PAGE.format(tenant.pk)).content.decode()
    assert "Counted per process (ANKUSA_STORE_SCOPE=node): each web worker process admits this much" in page
    listing = staff_client.get("/admin/limits/tenant/").content.decode()
    assert "1/s, burst 2 (tenant&#x27;s own), per process" in listing


def test_the_tenant_page_says_a_fleet_scope_limit_is_shared(staff_client, tenant, settings):
    settings.ANKUSA_STORE_SCOPE = "fleet"
    page = staff_client.get(PAGE.format(tenant.pk)).content.decode()
    assert "Counted once for every node (ANKUSA_STORE_SCOPE=fleet" in page and "per process" in page
    listing = staff_client.get("/admin/limits/tenant/").content.decode()
    assert "1/s, burst 2 (tenant&#x27;s own)<" in listing
