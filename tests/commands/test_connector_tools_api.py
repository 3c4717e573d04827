"""``POST /api/v1/connectors/{id}/test/`` and the signing-secret endpoints: who may, what a test
send sends and answers (outside any command), the pacing, the egress guard, and secrets shown once."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from standardwebhooks import Webhook

from commands.models import Attempt, Command, Connector
from queues.models import QueueItem
from tests.commands.sink import Sink

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


@pytest.fixture
def receiver(world):
    """Tenant A's connector, pointed at a live receiver answering 200 unless told otherwise."""
    with Sink() as sink:
        Connector.objects.filter(pk=world.a.connector.pk).update(url=sink.url)
        yield sink


def test_path(world, side="a") -> str:
    return f"/api/v1/connectors/{getattr(world, side).connector.pk}/test/"


test_path.__test__ = False  # type: ignore[attr-defined]


def counts() -> tuple[int, int, int]:
    return Command.objects.count(), Attempt.objects.count(), QueueItem.objects.count()


def test_an_operator_sends_a_marked_test_outside_any_command_and_reads_the_answer(
    world, call, receiver, clock
):
    before = counts()
    status, data = call("operator", "POST", test_path(world))
    assert status == 200
    assert {k: data[k] for k in ("ok", "outlook", "status", "excerpt", "error_class", "signed")} == {
        "ok": True,
        "outlook": "ok",
        "status": 200,
        "excerpt": '{"ok": true}',
        "error_class": "",
        "signed": False,
    }
    assert data["test_id"].startswith("test_") and data["ms"] >= 0
    [request] = receiver.received
    assert request.json == {"test": True, "connector": "billing", "tenant": "acme", "sent_at": T0.isoformat()}
    assert request.headers["Ankusa-Test"] == "true"
    assert counts() == before  # no command, no attempt, no queue item


def test_a_test_send_is_signed_like_a_real_send(world, call, receiver, clock):
    status, made = call("operator", "POST", f"/api/v1/connectors/{world.a.connector.pk}/signing-secrets/")
    assert status == 201
    status, data = call("operator", "POST", test_path(world))
    assert (status, data["signed"]) == (200, True)
    [request] = receiver.received
    assert Webhook(made["secret"]).verify(request.body, request.headers)["test"] is True
    assert request.headers["webhook-id"] == data["test_id"]


@pytest.mark.parametrize(
    ("answer", "status_map", "outlook"),
    [
        (503, {}, "again"),
        (422, {}, "never"),
        (401, {}, "after-fix"),
        (409, {"409": "never"}, "never"),
        (302, {}, "unknown"),
    ],
)
def test_a_failing_answer_gets_the_dispatchers_outlook(
    world, call, receiver, clock, answer, status_map, outlook
):
    Connector.objects.filter(pk=world.a.connector.pk).update(status_map=status_map)
    receiver.respond = lambda request, nth: (answer, {}, b'{"error": "no"}')
    status, data = call("operator", "POST", test_path(world))
    assert (status, data["ok"], data["status"], data["outlook"], data["excerpt"]) == (
        200,
        False,
        answer,
        outlook,
        '{"error": "no"}',
    )


def test_a_second_test_within_a_second_is_a_429_then_one_goes_again(world, call, receiver, clock):
    assert call("operator", "POST", test_path(world))[0] == 200
    response = world.client("admin").post(test_path(world))
    assert response.status_code == 429
    assert response["Retry-After"] == "1"
    assert json.loads(response.content) == {
        "error": "too_soon",
        "detail": "One test send a second per connector: try again in 1.0 s.",
    }
    assert call("operator", "POST", test_path(world, "b"))[0] == 200  # another connector is not held
    clock.move_to(T0 + timedelta(seconds=1))
    assert call("operator", "POST", test_path(world))[0] == 200
    assert len(receiver.received) == 2


def test_the_egress_guard_refuses_a_test_as_it_refuses_a_send(world, call, receiver, clock, settings):
    settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS = ()
    status, data = call("operator", "POST", test_path(world))
    assert (status, data["ok"], data["outlook"], data["status"], data["error_class"]) == (
        200,
        False,
        "after-fix",
        None,
        "Configuration",
    )
    assert "may not reach 127.0.0.1: it is a loopback address" in data["detail"]
    assert receiver.received == []


def test_a_log_connector_answers_ok_and_sends_nothing(world, call, clock):
    status, data = call("operator", "POST", f"/api/v1/connectors/{world.a.spare_connector.pk}/test/")
    assert (status, data["ok"], data["outlook"], data["status"], data["detail"]) == (
        200,
        True,
        "ok",
        None,
        "logged",
    )


@pytest.mark.parametrize(
    ("caller", "expected"), [("anonymous", 401), ("tenant_a", 403), ("viewer", 403), ("admin", 200)]
)
def test_who_may_send_a_test(world, call, receiver, clock, caller, expected):
    assert call(caller, "POST", test_path(world))[0] == expected
    assert len(receiver.received) == (1 if expected == 200 else 0)


def test_a_test_of_a_missing_or_huge_id_is_a_json_404(world, call):
    for pk in (999_999, 2**63, 10**30):
        status, data = call("operator", "POST", f"/api/v1/connectors/{pk}/test/")
        assert status == 404 and data["error"] in ("not_found", "not-found"), (pk, data)


@pytest.mark.parametrize("body", [{"payload": {}}, [1], "x", 5])
def test_a_test_takes_no_fields_a_400_says_so(world, call, receiver, body):
    status, data = call("operator", "POST", test_path(world), body)
    assert status == 400 and data["error"], data
    assert receiver.received == []


def test_a_body_that_is_not_json_is_a_400(world, receiver):
    response = world.client("operator").post(test_path(world), "{nope", content_type="application/json")
    assert response.status_code == 400
    assert json.loads(response.content)["error"] == "parse_error"


# --- signing secrets --------------------------------------------------------------------------------


def keys_path(world, side="a") -> str:
    return f"/api/v1/connectors/{getattr(world, side).connector.pk}/signing-secrets/"


def test_a_new_secret_is_in_the_create_answer_only(world, call):
    status, made = call("operator", "POST", keys_path(world))
    assert status == 201
    assert set(made) == {"id", "hint", "added_at", "secret"}
    assert made["secret"].startswith("whsec_") and made["hint"] == f"whsec_…{made['secret'][-4:]}"
    status, listed = call("operator", "GET", keys_path(world))
    assert (status, listed) == (200, [{"id": made["id"], "hint": made["hint"], "added_at": made["added_at"]}])
    for caller in ("operator", "admin", "tenant_a"):
        for path in (keys_path(world), f"/api/v1/connectors/{world.a.connector.pk}/", "/api/v1/connectors/"):
            response = world.client(caller).get(path)
            assert response.status_code == 200
            assert made["secret"][6:] not in response.content.decode(), (caller, path)


def test_rotation_through_the_api_add_then_drop_the_old(world, call):
    _, old = call("operator", "POST", keys_path(world))
    _, new = call("operator", "POST", keys_path(world))
    assert [k["id"] for k in call("viewer", "GET", keys_path(world))[1]] == [old["id"], new["id"]]
    assert call("operator", "DELETE", f"{keys_path(world)}{old['id']}/") == (204, None)
    assert [k["id"] for k in call("viewer", "GET", keys_path(world))[1]] == [new["id"]]
    status, data = call("operator", "DELETE", f"{keys_path(world)}{old['id']}/")
    assert (status, data["detail"]) == (404, f"The connector has no signing secret {old['id']}.")


@pytest.mark.parametrize(
    ("caller", "method", "expected"),
    [
        ("anonymous", "GET", 401),
        ("tenant_a", "GET", 200),
        ("tenant_b", "GET", 404),
        ("viewer", "GET", 200),
        ("tenant_a", "POST", 403),
        ("viewer", "POST", 403),
        ("operator", "POST", 201),
        ("admin", "POST", 201),
    ],
)
def test_who_may_read_and_rotate_signing_secrets(world, call, caller, method, expected):
    assert call(caller, method, keys_path(world))[0] == expected


def test_a_viewer_or_a_tenant_may_not_drop_a_secret(world, call):
    _, made = call("operator", "POST", keys_path(world))
    for caller in ("viewer", "tenant_a"):
        assert call(caller, "DELETE", f"{keys_path(world)}{made['id']}/")[0] == 403
    assert call("operator", "GET", keys_path(world))[1][0]["id"] == made["id"]


def test_refused_rotations_are_400s_that_say_why(world, call):
    status, data = call(
        "operator", "POST", f"/api/v1/connectors/{world.a.spare_connector.pk}/signing-secrets/"
    )
    assert (status, data["fields"]) == (
        400,
        {"signing_secrets": ["Only an http connector signs what it sends."]},
    )
    status, data = call("operator", "POST", keys_path(world), {"secret": "whsec_mine"})
    assert (status, data["fields"]) == (
        400,
        {"secret": ["Unknown field."]},
    )  # we make secrets, never take one
    for _ in range(5):
        assert call("operator", "POST", keys_path(world))[0] == 201
    status, data = call("operator", "POST", keys_path(world))
    assert status == 400 and "at most 5 signing secrets" in data["detail"]
    assert call("operator", "DELETE", f"{keys_path(world)}NOT-AN-ID/")[0] == 404


def test_a_test_refused_by_a_claim_made_after_its_clock_waits_one_second_at_most(world, clock):
    """Two requests at once: the one that read its clock first may find the other's later claim."""
    from commands.staff import connector_tools
    from tests.staff import staff_user

    connector = Connector.objects.get(pk=world.a.connector.pk)
    Connector.objects.filter(pk=connector.pk).update(tested_at=T0 + timedelta(milliseconds=300))
    with pytest.raises(connector_tools.TooSoon) as refused:
        connector_tools.send_test(connector, by=staff_user("operator", "op2"))
    assert refused.value.retry_after_s == 1.0
