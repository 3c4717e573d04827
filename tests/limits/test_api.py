"""REST: tenants with their effective limits, and one kind's override (GET/PUT/DELETE), as staff of
the admin group (who may see and do what: tests/commands/test_api_permissions.py)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from limits.admission import admit
from limits.models import LimitOverride, Tenant
from limits.store import Ok, RateLimited
from tests.limits.conftest import spend_burst
from tests.staff import api_client, staff_user

pytestmark = pytest.mark.django_db

URL = "/api/v1/tenants/acme/limits/hooks/"


@pytest.fixture
def staff():
    return staff_user("admin", "ops")


@pytest.fixture
def api(staff):
    return api_client(staff)


@pytest.fixture
def tenant():
    return Tenant.objects.create(slug="acme", name="Acme", hooks_rate=5, hooks_burst=10)


def test_the_tenant_list_shows_each_kinds_effective_limit_and_source(api, tenant, settings):
    settings.ANKUSA_DEFAULT_BYTES_RATE, settings.ANKUSA_DEFAULT_BYTES_BURST = None, None
    Tenant.objects.create(slug="beta", name="Beta")
    LimitOverride.objects.create(tenant=tenant, kind="bytes", rate=100.0, burst=500)
    response = api.get("/api/v1/tenants/")
    assert response.status_code == 200
    assert response.json()["results"] == [
        {
            "slug": "acme", "name": "Acme", "active": True, "max_body_bytes": 1048576,
            "hooks_rate": 5.0, "hooks_burst": 10, "bytes_rate": None, "bytes_burst": None,
            "limits": {
                "hooks": {"rate": 5.0, "burst": 10, "source": "tenant"},
                "bytes": {"rate": 100.0, "burst": 500, "source": "override"},
            },
        },
        {
            "slug": "beta", "name": "Beta", "active": True, "max_body_bytes": 1048576,
            "hooks_rate": None, "hooks_burst": None, "bytes_rate": None, "bytes_burst": None,
            "limits": {
                "hooks": {"rate": None, "burst": None, "source": "unlimited"},
                "bytes": {"rate": None, "burst": None, "source": "unlimited"},
            },
        },
    ]  # fmt: skip


def test_the_tenant_list_costs_the_same_queries_for_many_tenants(api, django_assert_max_num_queries):
    for n in range(30):
        tenant = Tenant.objects.create(slug=f"t{n}", name=f"T{n}")
        LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=1, burst=1)
    # The token and its last-use mark, the staff user's permissions (own and groups'), the tenants
    # and their overrides: six, however many tenants there are.
    with django_assert_max_num_queries(6):
        assert len(api.get("/api/v1/tenants/").json()["results"]) == 30


def test_get_shows_the_limit_without_an_override(api, tenant):
    response = api.get(URL)
    assert response.status_code == 200
    assert response.json() == {
        "tenant": "acme", "kind": "hooks", "rate": 5.0, "burst": 10, "source": "tenant", "override": None,
    }  # fmt: skip


def test_put_sets_the_override_and_resets_the_buckets(api, tenant, django_capture_on_commit_callbacks):
    spend_burst(tenant, 10)
    with django_capture_on_commit_callbacks(execute=True):
        response = api.put(
            URL, {"rate": 0.5, "burst": 20, "reason": "launch", "expires_at": "2099-01-01T00:00:00Z"},
            format="json",
        )  # fmt: skip
    assert response.status_code == 201
    body = response.json()
    assert (body["rate"], body["burst"], body["source"]) == (0.5, 20, "override")
    assert {k: body["override"][k] for k in ("rate", "burst", "reason", "set_by", "expires_at", "active")} == {
        "rate": 0.5, "burst": 20, "reason": "launch", "set_by": "ops",
        "expires_at": "2099-01-01T00:00:00Z", "active": True,
    }  # fmt: skip
    assert isinstance(admit(tenant, 0).result, Ok)
    again = api.put(URL, {"rate": 2, "burst": 3, "reason": "launch, day two"}, format="json")
    assert again.status_code == 200
    assert LimitOverride.objects.get().burst == 3


def test_delete_removes_the_override(api, tenant):
    LimitOverride.objects.create(tenant=tenant, kind="hooks", rate=1, burst=1)
    assert api.delete(URL).status_code == 204
    assert api.get(URL).json()["source"] == "tenant"
    response = api.delete(URL)
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "detail": "Tenant acme has no hooks override."}


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"rate": 1, "burst": 1, "tier": "gold"}, "tier: Unknown field."),
        ({"rate": 1, "brust": 5}, "burst: This field is required.; brust: Unknown field."),
        ({"rate": 0, "burst": 1, "reason": "r"}, "rate: must be greater than 0."),
        ({"rate": -2, "burst": 1, "reason": "r"}, "rate: must be greater than 0."),
        ({"rate": 1, "burst": 0, "reason": "r"}, "burst: must be at least 1."),
        ({"rate": 1, "burst": 1.5}, "burst: A valid integer is required."),
        ({"rate": "fast", "burst": 1}, "rate: A valid number is required."),
        ({"rate": True, "burst": 1}, "rate: A valid number is required."),
        ({"rate": 1, "burst": True}, "burst: A valid integer is required."),
        ({"rate": 1e12, "burst": 1, "reason": "r"}, "rate: must be at most 1000000000 per second."),
        ({"burst": 1}, "rate: This field is required."),
        ({"rate": 1, "burst": 1, "expires_at": "2001-01-01T00:00:00Z"}, "expires_at: Must be in the future."),
        (
            {"rate": 1, "burst": 1, "reason": "x" * 501},
            "reason: Ensure this field has no more than 500 characters.",
        ),
        (
            {"rate": 1, "burst": 1},
            "reason: Say why the override is needed: it is kept with it and in the history.",
        ),
        (
            {"rate": 1, "burst": 1, "reason": "  "},
            "reason: Say why the override is needed: it is kept with it and in the history.",
        ),
        ([1, 2], "non_field_errors: Invalid data. Expected a dictionary, but got list."),
    ],
)
def test_a_bad_put_is_a_400_naming_the_field(api, tenant, body, detail):
    response = api.put(URL, body, format="json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert response.json()["detail"] == detail
    assert not LimitOverride.objects.exists()


def test_malformed_json_is_a_400(api, tenant):
    response = api.put(URL, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "parse_error"


def test_an_oversized_body_is_a_413(api, tenant):
    response = api.put(URL, {"rate": 1, "burst": 1, "reason": "x" * 5000}, format="json")
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("/api/v1/tenants/nobody/limits/hooks/", "No Tenant matches the given query."),
        ("/api/v1/tenants/acme/limits/cpu/", "Unknown kind 'cpu': use one of hooks, bytes."),
    ],
)
def test_an_unknown_tenant_or_kind_is_a_404(api, tenant, url, detail):
    response = api.get(url)
    assert response.status_code == 404
    assert response.json() == {"error": "not_found", "detail": detail}


def test_anonymous_callers_are_refused(tenant):
    response = APIClient().get("/api/v1/tenants/")
    assert response.status_code == 401
    assert response.json()["error"] == "not_authenticated"


def test_non_staff_users_are_refused(tenant):
    client = APIClient()
    client.force_authenticate(get_user_model().objects.create_user("tenant-user"))
    response = client.put(URL, {"rate": 1, "burst": 1}, format="json")
    assert response.status_code == 403
    assert response.json()["error"] == "permission_denied"


def test_staff_may_use_their_session(staff, tenant):
    client = APIClient()
    client.force_login(staff)
    assert client.get(URL).status_code == 200


def test_post_is_not_allowed(api, tenant):
    response = api.post(URL, {"rate": 1, "burst": 1}, format="json")
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"


TENANT_URL = "/api/v1/tenants/acme/"


def test_patch_sets_a_tenants_own_limit_and_resets_its_buckets(
    api, tenant, django_capture_on_commit_callbacks
):
    spend_burst(tenant, 10)
    with django_capture_on_commit_callbacks(execute=True):
        # A window of 50 ms, far shorter than the 2 s of debt run up at 5/s: only a reset lets the
        # next request through.
        response = api.patch(TENANT_URL, {"hooks_rate": 100, "hooks_burst": 5}, format="json")
    assert response.status_code == 200
    body = response.json()
    assert (body["hooks_rate"], body["hooks_burst"]) == (100.0, 5)
    assert body["limits"]["hooks"] == {"rate": 100.0, "burst": 5, "source": "tenant"}
    tenant.refresh_from_db()
    assert tenant.own_limit("hooks") == (100.0, 5)
    assert isinstance(admit(tenant, 0).result, Ok)


def test_clearing_a_tenants_own_limit_falls_back_to_the_site_default(api, tenant, settings):
    settings.ANKUSA_DEFAULT_HOOKS_RATE, settings.ANKUSA_DEFAULT_HOOKS_BURST = 2.0, 4
    response = api.patch(TENANT_URL, {"hooks_rate": None, "hooks_burst": None}, format="json")
    assert response.status_code == 200
    assert response.json()["limits"]["hooks"] == {"rate": 2.0, "burst": 4, "source": "default"}
    tenant.refresh_from_db()
    assert tenant.own_limit("hooks") is None


def test_a_change_that_leaves_the_own_limits_alone_keeps_the_buckets(
    api, tenant, django_capture_on_commit_callbacks
):
    spend_burst(tenant, 10)
    with django_capture_on_commit_callbacks(execute=True):
        response = api.patch(
            TENANT_URL, {"name": "Acme Corp", "hooks_rate": 5, "hooks_burst": 10}, format="json"
        )
    assert response.status_code == 200
    assert isinstance(admit(tenant, 0).result, RateLimited)


def test_a_tenant_read_and_put_back_whole_is_accepted(api, tenant):
    read = api.get(TENANT_URL).json()
    response = api.put(TENANT_URL, {**read, "name": "Acme Corp"}, format="json")
    assert response.status_code == 200
    assert {k: v for k, v in response.json().items() if k != "name"} == {
        k: v for k, v in read.items() if k != "name"
    }


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"bytes_rate": 5}, {"bytes_burst": ["Set both bytes_rate and bytes_burst, or neither."]}),
        ({"hooks_burst": None}, {"hooks_burst": ["Set both hooks_rate and hooks_burst, or neither."]}),
        ({"hooks_rate": 0}, {"hooks_rate": ["must be greater than 0."]}),
        ({"hooks_rate": 1e12}, {"hooks_rate": ["must be at most 1000000000 per second."]}),
        ({"hooks_rate": True}, {"hooks_rate": ["A valid number is required."]}),
        ({"hooks_rate": "fast"}, {"hooks_rate": ["A valid number is required."]}),
        ({"hooks_burst": 0}, {"hooks_burst": ["must be at least 1."]}),
        ({"hooks_burst": -1}, {"hooks_burst": ["Ensure this value is greater than or equal to 0."]}),
        ({"hooks_burst": 2**31}, {"hooks_burst": ["Ensure this value is less than or equal to 2147483647."]}),
        ({"hooks_limit": 5}, {"hooks_limit": ["Unknown field."]}),
    ],
)
def test_a_bad_own_limit_is_a_400_naming_the_field_and_changes_nothing(api, tenant, body, fields):
    response = api.patch(TENANT_URL, body, format="json")
    assert response.status_code == 400, response.json()
    assert (response.json()["error"], response.json()["fields"]) == ("invalid", fields)
    tenant.refresh_from_db()
    assert (tenant.own_limit("hooks"), tenant.own_limit("bytes")) == ((5.0, 10), None)
