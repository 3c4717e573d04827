"""REST: tenants — a tenant token sees its own tenant only; admins create and change tenants (never
their slug) and their own limits (tests/limits/test_api.py); overrides have their own endpoint."""

from __future__ import annotations

import pytest

from limits.models import Tenant


def test_a_tenant_token_reads_its_own_tenant_and_limits(world, call):
    status, data = call("tenant_a", "GET", "/api/v1/tenants/acme/")
    assert (status, data["slug"], data["limits"]["bytes"]) == (
        200, "acme", {"rate": 100.0, "burst": 1000, "source": "override"},
    )  # fmt: skip
    status, data = call("tenant_a", "GET", "/api/v1/tenants/acme/limits/bytes/")
    assert (status, data["override"]["rate"]) == (200, 100.0)


def test_an_admin_creates_a_tenant_with_its_own_body_limit(world, call):
    body = {"slug": "initech", "name": "Initech", "max_body_bytes": 4096}
    status, data = call("admin", "POST", "/api/v1/tenants/", body)
    assert status == 201
    assert (data["slug"], data["max_body_bytes"], data["active"]) == ("initech", 4096, True)
    assert Tenant.objects.get(slug="initech").max_body_bytes == 4096


def test_an_admin_deactivates_a_tenant_whose_token_then_stops_working(world, call):
    status, data = call("admin", "PATCH", "/api/v1/tenants/acme/", {"active": False})
    assert (status, data["active"]) == (200, False)
    status, data = call("tenant_a", "GET", "/api/v1/tenants/")
    assert (status, data["error"]) == (401, "authentication_failed")


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/api/v1/tenants/", {"slug": "bad slug!", "name": "x"}, "slug"),
        ("POST", "/api/v1/tenants/", {"slug": "acme", "name": "again"}, "slug"),
        ("POST", "/api/v1/tenants/", {"name": "no slug"}, "slug"),
        ("PATCH", "/api/v1/tenants/acme/", {"slug": "renamed"}, "slug"),
        ("PATCH", "/api/v1/tenants/acme/", {"max_body_bytes": 0}, "max_body_bytes"),
        ("PATCH", "/api/v1/tenants/acme/", {"max_body_bytes": 2**40}, "max_body_bytes"),
    ],
)
def test_a_bad_tenant_is_a_400_naming_the_field(world, call, method, path, body, field):
    status, data = call("admin", method, path, body)
    assert (status, data["error"]) == (400, "invalid"), data
    assert field in data["fields"]
    assert Tenant.objects.get(slug="acme").name == "Acme"


def test_there_is_no_deleting_a_tenant_through_the_api(world, call):
    status, data = call("admin", "DELETE", "/api/v1/tenants/acme/")
    assert (status, data["error"]) == (405, "method_not_allowed")


def test_a_tenant_token_cannot_raise_its_own_limits(world, call):
    before = Tenant.objects.get(slug="acme").own_limit("hooks")
    status, data = call(
        "tenant_a", "PATCH", "/api/v1/tenants/acme/", {"hooks_rate": 1e6, "hooks_burst": 10**6}
    )
    assert (status, data["error"]) == (403, "permission_denied")
    assert Tenant.objects.get(slug="acme").own_limit("hooks") == before
