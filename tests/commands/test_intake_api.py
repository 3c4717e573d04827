"""``POST /api/v1/commands/``: the same admission as a webhook, for a tenant's own connectors only."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from commands.lifecycle import QUEUE_NAME
from commands.models import Command
from commands.states import State
from limits.models import ApiToken, Tenant
from limits.store import forget_store
from queues.backends import get_queue


def client_with(token: str | None = None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def token(tenant):
    return ApiToken.issue(name="billing", tenant=tenant)[1]


@pytest.fixture
def other_tenant(db):
    return Tenant.objects.create(slug="globex", name="Globex")


@pytest.fixture
def api(token):
    """POST a JSON body (a dict, or raw bytes) with the tenant's token."""
    client = client_with(token)

    def post(body, *, key: str | None = None, content_type: str = "application/json", **extra):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = {"Idempotency-Key": key} if key is not None else {}
        return client.post("/api/v1/commands/", raw, content_type=content_type, headers=headers, **extra)

    return post


@pytest.fixture
def receiver(make_connector):
    return make_connector("receiver", url="http://127.0.0.1:9/")


def answer(response) -> tuple[int, dict]:
    return response.status_code, json.loads(response.content)


def test_a_tenant_token_submits_a_command_that_is_queued_at_once(api, receiver):
    response = api({"connector": receiver.pk, "payload": {"order": "A-1"}}, key="order-A-1")
    command = Command.objects.get()
    assert answer(response) == (
        202,
        {
            "status": "accepted",
            "id": command.pk,
            "connector": receiver.pk,
            "state": "queued",
            "created_at": command.created_at.isoformat().replace("+00:00", "Z"),
        },
    )
    assert (command.tenant.slug, command.source, command.delivery, command.payload) == (
        "acme",
        None,
        None,
        {"order": "A-1"},
    )
    assert (command.idempotency_key, command.state, command.attempts) == ("order-A-1", State.QUEUED, 0)
    assert [item.payload for item in get_queue(QUEUE_NAME).peek("main", 10)] == [
        {"command": command.pk, "attempt": 1}
    ]


def test_a_connector_can_be_named_instead_of_numbered(api, receiver):
    assert api({"connector": "receiver", "payload": {}}).status_code == 202
    assert Command.objects.get().connector == receiver


def test_a_repeated_idempotency_key_answers_200_with_the_original_command(api, receiver):
    first = api({"connector": receiver.pk, "payload": {"n": 1}}, key="k-1")
    again = api({"connector": receiver.pk, "payload": {"n": 1}}, key="k-1")
    status, data = answer(again)
    assert (status, data["status"], data["id"]) == (200, "duplicate", json.loads(first.content)["id"])
    assert Command.objects.count() == 1


def test_the_database_refuses_a_repeated_key_the_claim_store_forgot(api, receiver):
    first = api({"connector": receiver.pk, "payload": {"n": 1}}, key="k-1")
    forget_store()  # another node, or Redis lost the claim
    status, data = answer(api({"connector": receiver.pk, "payload": {"n": 1}}, key="k-1"))
    assert (status, data["id"]) == (200, json.loads(first.content)["id"])
    assert Command.objects.count() == 1


def test_a_repeated_key_with_another_payload_is_422_and_stores_nothing(api, receiver):
    api({"connector": receiver.pk, "payload": {"n": 1}}, key="k-1")
    status, data = answer(api({"connector": receiver.pk, "payload": {"n": 2}}, key="k-1"))
    assert (status, data["error"]) == (422, "idempotency_key_reused")
    assert Command.objects.count() == 1


@pytest.mark.parametrize(
    ("first", "then"),
    [(1, True), (0, False), ([1], [True]), ({"a": {"b": 1}}, {"a": {"b": True}}), ("1", 1), (1, 2)],
)
def test_a_repeated_key_with_a_payload_equal_only_to_python_is_422(api, receiver, first, then):
    api({"connector": receiver.pk, "payload": {"amount": first}}, key="k-1")
    status, data = answer(api({"connector": receiver.pk, "payload": {"amount": then}}, key="k-1"))
    assert (status, data["error"]) == (422, "idempotency_key_reused")


@pytest.mark.parametrize("number", [1e16, 2.5e20, 1.0, 1e-7, 12345678901234567890])
def test_a_retry_of_a_number_the_database_writes_back_otherwise_is_a_duplicate(api, receiver, number):
    body = {"connector": receiver.pk, "payload": {"n": number}}
    assert api(body, key="k-1").status_code == 202
    status, data = answer(api(body, key="k-1"))
    assert (status, data["status"]) == (200, "duplicate")


def test_a_repeated_key_with_the_same_payload_in_another_key_order_is_a_duplicate(api, receiver):
    api({"connector": receiver.pk, "payload": {"a": 1, "b": [1.5, None, "x"]}}, key="k-1")
    status, data = answer(
        api({"connector": receiver.pk, "payload": {"b": [1.5, None, "x"], "a": 1}}, key="k-1")
    )
    assert (status, data["status"]) == (200, "duplicate")


def test_without_a_key_every_submission_is_a_new_command(api, receiver):
    assert [api({"connector": receiver.pk, "payload": {}}).status_code for _ in range(2)] == [202, 202]
    assert list(Command.objects.values_list("idempotency_key", flat=True)) == ["", ""]


def test_the_same_key_in_two_tenants_is_two_commands(api, receiver, other_tenant):
    from commands.models import Connector

    theirs = Connector.objects.create(tenant=other_tenant, name="receiver", kind="log")
    their_token = ApiToken.issue(name="t", tenant=other_tenant)[1]
    body = json.dumps({"connector": theirs.pk, "payload": {}})
    assert api({"connector": receiver.pk, "payload": {}}, key="k").status_code == 202
    theirs_answer = client_with(their_token).post(
        "/api/v1/commands/", body, content_type="application/json", headers={"Idempotency-Key": "k"}
    )
    assert theirs_answer.status_code == 202
    assert Command.objects.count() == 2


def test_another_tenants_connector_is_answered_like_one_that_does_not_exist(api, other_tenant):
    from commands.models import Connector

    theirs = Connector.objects.create(tenant=other_tenant, name="theirs", kind="log")
    foreign = answer(api({"connector": theirs.pk, "payload": {}}))
    missing = answer(api({"connector": theirs.pk + 1000, "payload": {}}))
    assert foreign[0] == missing[0] == 400
    assert foreign[1]["error"] == missing[1]["error"] == "invalid"
    assert Command.objects.count() == 0


def test_a_tenant_token_cannot_submit_for_another_tenant(api, receiver, other_tenant):
    status, data = answer(api({"connector": receiver.pk, "payload": {}, "tenant": "globex"}))
    assert (status, data["error"]) == (403, "permission_denied")
    assert api({"connector": receiver.pk, "payload": {}, "tenant": "acme"}).status_code == 202


def test_staff_with_the_add_permission_submit_on_behalf_of_the_tenant_they_name(receiver, django_user_model):
    staff = django_user_model.objects.create_user("ops", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="add_command"))
    client = client_with(ApiToken.issue(name="ops", user=staff)[1])

    def post(body):
        return answer(client.post("/api/v1/commands/", body, format="json"))

    assert post({"connector": receiver.pk, "payload": {}})[1]["error"] == "invalid"  # no tenant named
    assert post({"connector": receiver.pk, "payload": {}, "tenant": "acme"})[0] == 202
    assert post({"connector": receiver.pk, "payload": {}, "tenant": "nobody"})[0] == 400


def test_staff_without_the_permission_and_anonymous_clients_are_refused(receiver, django_user_model):
    staff = django_user_model.objects.create_user("viewer", is_staff=True)
    body = {"connector": receiver.pk, "payload": {}, "tenant": "acme"}
    viewer = client_with(ApiToken.issue(name="v", user=staff)[1]).post(
        "/api/v1/commands/", body, format="json"
    )
    anonymous = client_with().post("/api/v1/commands/", body, format="json")
    assert answer(viewer)[0] == 403
    assert answer(anonymous) == (
        401,
        {"error": "not_authenticated", "detail": "Authentication credentials were not provided."},
    )
    assert Command.objects.count() == 0


def test_over_the_quota_is_429_with_retry_after(api, receiver, tenant):
    Tenant.objects.filter(pk=tenant.pk).update(hooks_rate=0.001, hooks_burst=1)
    assert api({"connector": receiver.pk, "payload": {}}).status_code == 202
    limited = api({"connector": receiver.pk, "payload": {}})
    assert (limited.status_code, json.loads(limited.content)["error"]) == (429, "rate_limited")
    assert int(limited["Retry-After"]) >= 999
    assert Command.objects.count() == 1


def test_a_body_over_the_tenants_limit_is_413_before_it_is_read(api, receiver, tenant):
    Tenant.objects.filter(pk=tenant.pk).update(max_body_bytes=100)
    status, data = answer(api({"connector": receiver.pk, "payload": {}}, CONTENT_LENGTH="101"))
    assert (status, data["error"]) == (413, "too_large")


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "bad_json"),
        (b"\xff\xfe{}", 400, "bad_encoding"),
        (b"[" * 50_000 + b"]" * 50_000, 400, "bad_json"),
        (b'{"connector": 1, "payload": {"a": "\\u0000"}}', 400, "bad_json"),
        (b"[]", 400, "invalid"),
        (b'{"payload": {}}', 400, "invalid"),
        (b'{"connector": 1, "payload": {}, "priority": "high"}', 400, "invalid"),
        (b'{"connector": true, "payload": {}}', 400, "invalid"),
        (b'{"connector": 99999999999999999999999, "payload": {}}', 400, "invalid"),
        (b'{"connector": "receiver", "payload": [1, 2]}', 400, "invalid"),
        (b'{"connector": "receiver", "payload": "text"}', 400, "invalid"),
    ],
)
def test_hostile_bodies_are_4xx_json_and_store_nothing(api, receiver, body, status, code):
    got_status, data = answer(api(body))
    assert (got_status, data["error"]) == (status, code)
    assert Command.objects.count() == 0


def test_unknown_fields_are_named_in_the_error(api, receiver):
    status, data = answer(api({"connector": receiver.pk, "payload": {}, "priority": "high"}))
    assert (status, data["fields"]) == (400, {"priority": ["Unknown field."]})


def test_a_body_that_is_not_declared_json_is_415(api, receiver):
    status, data = answer(api(b"connector=1", content_type="application/x-www-form-urlencoded"))
    assert (status, data["error"]) == (415, "unsupported_media_type")


# GET is the command list now (tests/commands/test_api_commands.py).
@pytest.mark.parametrize("method", ["put", "patch", "delete"])
def test_other_methods_are_405_json(token, method):
    response = getattr(client_with(token), method)("/api/v1/commands/")
    assert (response.status_code, json.loads(response.content)["error"]) == (405, "method_not_allowed")


def test_a_huge_idempotency_key_is_kept_as_its_sha256(api, receiver):
    assert api({"connector": receiver.pk, "payload": {}}, key="k" * 8000).status_code == 202
    assert api({"connector": receiver.pk, "payload": {}}, key="k" * 8000).status_code == 200
    assert Command.objects.get().idempotency_key.startswith("sha256:")
