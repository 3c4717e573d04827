"""Who may do what under /api/v1/: every endpoint and every action against the six kinds of caller,
and no caller reaching another tenant's rows (a 404 exactly like a missing row)."""

from __future__ import annotations

import pytest

from tests.api_world import CALLERS

# Expected statuses in the order of CALLERS: anonymous, tenant A, tenant B, viewer, operator, admin.
TENANT_LIST = (401, 200, 200, 200, 200, 200)  # tenant tokens see their own rows only (checked below)
A_ROW = (401, 200, 404, 200, 200, 200)  # tenant B: a 404, as for a row that does not exist
STAFF_READ = (401, 403, 403, 200, 200, 200)  # never for tenant tokens
ADMIN_ONLY = (401, 403, 403, 403, 403)
OPERATOR_UP = (401, 403, 403, 403)
READ_ONLY = (401, 405, 405, 405, 405, 405)

MATRIX = [
    ("GET", "/api/v1/tenants/", None, TENANT_LIST),
    ("GET", "/api/v1/tenants/acme/", None, A_ROW),
    ("GET", "/api/v1/tenants/acme/limits/hooks/", None, A_ROW),
    ("GET", "/api/v1/sources/", None, TENANT_LIST),
    ("GET", "/api/v1/sources/{a_source}/", None, A_ROW),
    ("GET", "/api/v1/connectors/", None, TENANT_LIST),
    ("GET", "/api/v1/connectors/{a_connector}/", None, A_ROW),
    ("GET", "/api/v1/connectors/health/", None, TENANT_LIST),
    ("GET", "/api/v1/connectors/{a_connector}/health/", None, A_ROW),
    ("GET", "/api/v1/commands/", None, TENANT_LIST),
    ("GET", "/api/v1/commands/?state=failed&skip_reason=never", None, TENANT_LIST),
    ("GET", "/api/v1/commands/{a_command}/", None, A_ROW),
    ("GET", "/api/v1/commands/{a_command}/attempts/", None, A_ROW),
    ("GET", "/api/v1/deliveries/", None, TENANT_LIST),
    ("GET", "/api/v1/deliveries/{a_delivery}/", None, A_ROW),
    ("GET", "/api/v1/audit-entries/", None, STAFF_READ),
    ("GET", "/api/v1/audit-entries/{audit}/", None, STAFF_READ),
    ("GET", "/api/v1/queues/", None, STAFF_READ),
    ("GET", "/api/v1/queues/commands/", None, STAFF_READ),
    ("POST", "/api/v1/tenants/", {"slug": "initech", "name": "Initech"}, (*ADMIN_ONLY, 201)),
    ("PATCH", "/api/v1/tenants/acme/", {"name": "Acme Inc"}, (*ADMIN_ONLY, 200)),
    ("PUT", "/api/v1/tenants/acme/limits/hooks/", {"rate": 1, "burst": 1, "reason": "launch"}, (*ADMIN_ONLY, 201)),
    ("DELETE", "/api/v1/tenants/acme/limits/bytes/", None, (*ADMIN_ONLY, 204)),
    ("POST", "/api/v1/connectors/", {"tenant": "acme", "name": "new", "kind": "log"}, (*ADMIN_ONLY, 201)),
    ("PATCH", "/api/v1/connectors/{a_connector}/", {"enabled": False}, (*OPERATOR_UP, 200, 200)),
    ("DELETE", "/api/v1/connectors/{a_spare_connector}/", None, (*ADMIN_ONLY, 204)),
    ("POST", "/api/v1/connectors/{a_connector}/test/", None, (*OPERATOR_UP, 200, 200)),
    ("GET", "/api/v1/connectors/{a_connector}/signing-secrets/", None, A_ROW),
    ("POST", "/api/v1/connectors/{a_connector}/signing-secrets/", None, (*OPERATOR_UP, 201, 201)),
    # No such secret: past the permission check, a 404.
    ("DELETE", "/api/v1/connectors/{a_connector}/signing-secrets/0123abcd/", None, (*OPERATOR_UP, 404, 404)),
    ("POST", "/api/v1/connectors/{a_connector}/pause/", {"reason": "migrating"}, (*OPERATOR_UP, 200, 200)),
    ("POST", "/api/v1/connectors/{a_connector}/resume/", {}, (*OPERATOR_UP, 409, 409)),  # not paused
    ("POST", "/api/v1/sources/", {"tenant": "acme", "slug": "new"}, (*ADMIN_ONLY, 201)),
    ("PATCH", "/api/v1/sources/{a_source}/", {"needs_approval": True}, (*OPERATOR_UP, 200, 200)),
    ("DELETE", "/api/v1/sources/{a_spare_source}/", None, (*ADMIN_ONLY, 204)),
    # Tenant B names tenant A: refused, whatever the connector.
    (
        "POST", "/api/v1/commands/", {"connector": "{a_connector}", "payload": {}, "tenant": "acme"},
        (401, 202, 403, 403, 202, 202),
    ),
    ("POST", "/api/v1/commands/{a_command}/approve/", {"dry_run": True}, (*OPERATOR_UP, 200, 200)),
    ("POST", "/api/v1/commands/{a_command}/resend/", {"dry_run": True}, (*OPERATOR_UP, 200, 200)),
    ("POST", "/api/v1/commands/{a_command}/cancel/", {"dry_run": True}, (*OPERATOR_UP, 200, 200)),
    ("POST", "/api/v1/commands/{a_command}/new-command/", {"reason": "fixed"}, (*OPERATOR_UP, 201, 201)),
    ("POST", "/api/v1/commands/approve/", {"ids": ["{a_command}"], "dry_run": True}, (*OPERATOR_UP, 200, 200)),
    ("POST", "/api/v1/commands/resend/", {"ids": ["{a_command}"], "dry_run": True}, (*OPERATOR_UP, 200, 200)),
    ("POST", "/api/v1/commands/cancel/", {"filter": {"state": "failed"}, "dry_run": True}, (*OPERATOR_UP, 200, 200)),
    ("POST", "/api/v1/queues/commands/requeue-failed/", {}, (*ADMIN_ONLY, 200)),
    ("POST", "/api/v1/queues/commands/remove-failed/", {}, (*ADMIN_ONLY, 200)),
    ("DELETE", "/api/v1/deliveries/{a_delivery}/", None, READ_ONLY),
    ("POST", "/api/v1/audit-entries/", {}, READ_ONLY),
    ("DELETE", "/api/v1/commands/{a_command}/", None, READ_ONLY),
]  # fmt: skip


def ids_of(world) -> dict[str, int]:
    a = world.a
    return {
        "a_source": a.source.pk, "a_spare_source": a.spare_source.pk, "a_connector": a.connector.pk,
        "a_spare_connector": a.spare_connector.pk, "a_command": a.command.pk, "a_delivery": a.delivery.pk,
        "audit": world.audit.pk,
    }  # fmt: skip


def fill(value, ids: dict[str, int]):
    """The matrix's placeholders ("{a_command}") with this world's ids (numbers in JSON bodies)."""
    if isinstance(value, str):
        if value.startswith("{") and value.endswith("}") and value[1:-1] in ids:
            return ids[value[1:-1]]
        return value.format(**ids)
    if isinstance(value, dict):
        return {key: fill(item, ids) for key, item in value.items()}
    if isinstance(value, list):
        return [fill(item, ids) for item in value]
    return value


CASES = [
    pytest.param(caller, method, path, body, expected[i], id=f"{caller}-{method}-{path}")
    for method, path, body, expected in MATRIX
    for i, caller in enumerate(CALLERS)
]


@pytest.mark.parametrize(("caller", "method", "path", "body", "expected"), CASES)
def test_who_may_do_what(world, call, caller, method, path, body, expected):
    ids = ids_of(world)
    status, data = call(caller, method, fill(path, ids), fill(body, ids))
    assert status == expected, data
    if status >= 400:
        assert set(data) >= {"error", "detail"}


def test_the_matrix_covers_every_route_of_the_api(world):
    from django.urls import get_resolver, resolve

    ids = ids_of(world)
    covered = {resolve(fill(path, ids).split("?")[0]).url_name for _, path, _, _ in MATRIX}
    routes = {
        name
        for name in get_resolver().reverse_dict
        if isinstance(name, str) and name.startswith(("limits-", "commands-", "queues-"))
    }
    assert routes == covered


@pytest.mark.parametrize("kind", ["sources", "connectors", "commands", "deliveries"])
def test_a_tenant_token_lists_only_its_own_rows(world, call, kind):
    own = {"sources": [world.a.source.pk, world.a.spare_source.pk],
           "connectors": [world.a.connector.pk, world.a.spare_connector.pk],
           "commands": [world.a.command.pk], "deliveries": [world.a.delivery.pk]}[kind]  # fmt: skip
    for caller, side in (("tenant_a", world.a), ("tenant_b", world.b)):
        status, data = call(caller, "GET", f"/api/v1/{kind}/")
        assert status == 200
        assert {row["tenant"] for row in data["results"]} == {side.tenant.slug}
    status, data = call("tenant_a", "GET", f"/api/v1/{kind}/")
    assert sorted(row["id"] for row in data["results"]) == sorted(own)


def test_a_tenant_token_lists_only_its_own_tenant(world, call):
    assert [t["slug"] for t in call("tenant_a", "GET", "/api/v1/tenants/")[1]["results"]] == ["acme"]
    assert [t["slug"] for t in call("admin", "GET", "/api/v1/tenants/")[1]["results"]] == ["acme", "globex"]


def test_a_tenant_filter_does_not_widen_a_tenant_tokens_view(world, call):
    status, data = call("tenant_a", "GET", "/api/v1/commands/?tenant=globex")
    assert (status, data["results"]) == (200, [])


def test_another_tenants_row_is_answered_exactly_like_a_missing_one(world, call):
    for kind, row in (("commands", world.a.command), ("connectors", world.a.connector),
                      ("sources", world.a.source), ("deliveries", world.a.delivery),
                      ("tenants", world.a.tenant)):  # fmt: skip
        key = row.slug if kind == "tenants" else row.pk
        missing = "nobody" if kind == "tenants" else 999999
        theirs = call("tenant_b", "GET", f"/api/v1/{kind}/{key}/")
        assert theirs == call("tenant_b", "GET", f"/api/v1/{kind}/{missing}/")
        assert theirs[0] == 404
    assert call("tenant_b", "GET", f"/api/v1/commands/{world.a.command.pk}/attempts/")[0] == 404
    assert call("tenant_b", "GET", "/api/v1/tenants/acme/limits/hooks/") == call(
        "tenant_b", "GET", "/api/v1/tenants/nobody/limits/hooks/"
    )


def test_a_tenant_token_cannot_submit_to_another_tenants_connector(world, call):
    status, data = call(
        "tenant_b", "POST", "/api/v1/commands/", {"connector": world.a.connector.pk, "payload": {}}
    )
    assert (status, data["error"]) == (400, "invalid")


def test_anonymous_callers_get_a_json_401_with_the_bearer_challenge(world):
    response = world.client("anonymous").get("/api/v1/commands/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'
    assert response.json()["error"] == "not_authenticated"


def test_a_staff_action_by_a_tenant_token_changes_nothing(world, call):
    status, _ = call("tenant_a", "POST", f"/api/v1/commands/{world.a.command.pk}/cancel/", {})
    assert status == 403
    world.a.command.refresh_from_db()
    assert world.a.command.state == "failed"


def test_a_token_of_a_user_who_is_not_staff_is_refused(world):
    from django.contrib.auth import get_user_model

    from tests.staff import api_client

    user = get_user_model().objects.create_user("plain")
    assert api_client(user).get("/api/v1/commands/").status_code == 403


def test_staff_may_use_their_session(world):
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(get_user_model().objects.get(username="viewer"))
    assert client.get("/api/v1/commands/").status_code == 200
    assert client.post("/api/v1/commands/approve/", {"ids": [1]}, format="json").status_code == 403
