"""REST staff actions: the same guards, dry run and audit as the admin, through commands.staff.actions."""

from __future__ import annotations

import pytest

from commands.models import AuditEntry, Command, Connector
from commands.retry import Outlook
from commands.states import State


@pytest.fixture
def failed(world):
    """Tenant A's failed commands: 3 resendable (idempotent, again), 2 on a non-idempotent
    connector, 1 with an unknown outcome, plus the world's ``never`` one."""
    a = world.a
    safe = Connector.objects.create(tenant=a.tenant, name="safe", kind="log", idempotent=True)
    rows = {"safe": [], "not_idempotent": [], "unknown": []}
    for _ in range(3):
        rows["safe"].append(make(a.tenant, safe, last_outlook=Outlook.AGAIN, skip_reason="attempts-spent"))
    for _ in range(2):
        rows["not_idempotent"].append(make(a.tenant, a.connector, last_outlook=Outlook.AGAIN))
    rows["unknown"].append(make(a.tenant, safe, last_outlook="", skip_reason="outlook-unknown"))
    rows["never"] = [a.command]
    return rows


def make(tenant, connector, **fields) -> Command:
    return Command.objects.create(
        tenant=tenant, connector=connector, payload={}, state=State.FAILED, attempts=3, **fields
    )


def ids(rows) -> list[int]:
    return [c.pk for c in rows]


def snapshot() -> list[tuple]:
    return list(Command.objects.order_by("pk").values_list("pk", "state", "resend_by", "next_attempt_at"))


def test_a_dry_run_writes_nothing_and_gives_the_breakdown(call, failed):
    before = snapshot()
    status, data = call("operator", "POST", "/api/v1/commands/resend/", {"filter": {"state": "failed",
                        "tenant": "acme"}, "dry_run": True})  # fmt: skip
    assert status == 200
    assert data == {
        "action": "resend", "total": 7, "will": 3,
        "need_override": {"connector not idempotent": 2, "outlook unknown": 1},
        "cannot": {"never: make a new command instead": 1},
        "summary": "3 will be resent, 3 need an override: 2 connector not idempotent, 1 outlook unknown; "
                   "1 cannot: 1 never: make a new command instead",
    }  # fmt: skip
    assert snapshot() == before
    assert not AuditEntry.objects.exclude(action="cancel", via="admin").exists()


def test_resend_without_override_leaves_the_non_idempotent_ones_and_audits(call, failed, world):
    status, data = call("operator", "POST", "/api/v1/commands/resend/", {"ids": ids(failed["not_idempotent"])
                        + ids(failed["safe"])})  # fmt: skip
    assert status == 200
    assert (data["done"], data["skipped"]) == (3, {"connector not idempotent": 2})
    entry = AuditEntry.objects.get(pk=data["audit"])
    assert (entry.username, entry.action, entry.via, entry.count, entry.done) == (
        "operator",
        "resend",
        "api",
        5,
        3,
    )
    assert sorted(entry.commands.values_list("pk", flat=True)) == ids(failed["safe"])
    assert Command.objects.filter(pk__in=ids(failed["not_idempotent"]), resend_by__isnull=False).count() == 0


def test_resend_with_override_and_reason_by_an_admin_is_done_and_audited(call, failed):
    target = failed["not_idempotent"][0]
    body = {"override": True, "reason": "receiver confirmed it never arrived"}
    status, data = call("admin", "POST", f"/api/v1/commands/{target.pk}/resend/", body)
    assert (status, data["done"], data["skipped"]) == (200, 1, {})
    target.refresh_from_db()
    assert target.resend_by.username == "admin"
    entry = AuditEntry.objects.get(pk=data["audit"])
    assert (entry.action, entry.reason, entry.via) == ("resend-override", body["reason"], "api")
    assert list(entry.commands.values_list("pk", flat=True)) == [target.pk]
    status, data = call("admin", "GET", f"/api/v1/audit-entries/{entry.pk}/")
    assert (status, data["commands"], data["reason"]) == (200, [target.pk], body["reason"])


def test_resend_with_override_by_an_operator_is_403_and_changes_nothing(call, failed):
    before = snapshot()
    target = failed["not_idempotent"][0]
    for dry_run in (True, False):
        status, data = call("operator", "POST", f"/api/v1/commands/{target.pk}/resend/",
                            {"override": True, "reason": "sure", "dry_run": dry_run})  # fmt: skip
        assert (status, data["error"]) == (403, "permission_denied")
    assert snapshot() == before
    assert not AuditEntry.objects.filter(via="api").exists()


def test_an_override_without_a_reason_is_refused(call, failed):
    target = failed["unknown"][0]
    status, data = call("admin", "POST", f"/api/v1/commands/{target.pk}/resend/", {"override": True})
    assert (status, data["error"]) == (400, "reason_required")
    assert not Command.objects.filter(resend_by__isnull=False).exists()


def test_an_override_in_a_dry_run_counts_the_guarded_ones_as_will(call, failed):
    status, data = call("admin", "POST", "/api/v1/commands/resend/",
                        {"ids": ids(failed["unknown"] + failed["safe"]), "override": True, "dry_run": True})  # fmt: skip
    assert (status, data["will"], data["need_override"]) == (200, 4, {})


def test_cancel_is_a_compare_and_set(call, failed):
    target = failed["safe"][0]
    first = call("operator", "POST", f"/api/v1/commands/{target.pk}/cancel/", {})
    second = call("operator", "POST", f"/api/v1/commands/{target.pk}/cancel/", {})
    assert (first[0], first[1]["done"]) == (200, 1)
    assert (second[0], second[1]["error"]) == (409, "nothing_to_do")
    assert (
        second[1]["detail"]
        == "Nothing to cancel: none of the 1 command(s) can be cancelled; 1 cannot: 1 already finished."
    )
    target.refresh_from_db()
    assert target.state == State.CANCELLED


def test_approve_changes_drafts_only(call, world):
    draft = Command.objects.create(
        tenant=world.a.tenant, connector=world.a.connector, payload={}, state=State.DRAFT
    )
    status, data = call("operator", "POST", "/api/v1/commands/approve/",
                        {"ids": [draft.pk, world.a.command.pk]})  # fmt: skip
    assert (status, data["done"], data["skipped"]) == (200, 1, {"not a draft": 1})
    draft.refresh_from_db()
    assert (draft.state, draft.approved_by.username) == (State.APPROVED, "operator")
    again = call("operator", "POST", f"/api/v1/commands/{draft.pk}/approve/", {})
    assert (again[0], again[1]["error"]) == (409, "nothing_to_do")


def test_new_command_copies_a_failed_command_with_a_new_payload_and_links_both(call, world):
    original = world.a.command
    status, data = call("operator", "POST", f"/api/v1/commands/{original.pk}/new-command/",
                        {"payload": {"order": 2}, "reason": "corrected the order"})  # fmt: skip
    assert status == 201
    assert (data["payload"], data["resent_from"], data["state"]) == ({"order": 2}, original.pk, "approved")
    assert data["links"]["resent_from"].endswith(f"/api/v1/commands/{original.pk}/")
    status, detail = call("tenant_a", "GET", f"/api/v1/commands/{original.pk}/")
    assert (detail["state"], detail["resent_as"]) == ("cancelled", [data["id"]])
    assert detail["links"]["resent_as"][0].endswith(f"/api/v1/commands/{data['id']}/")
    status, again = call("operator", "POST", f"/api/v1/commands/{original.pk}/new-command/", {})
    assert (status, again["error"]) == (409, "not_failed")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "non_field_errors"),
        ({"ids": [1], "filter": {"state": "failed"}}, "non_field_errors"),
        ({"ids": []}, "ids"),
        ({"ids": [2**63]}, "ids"),
        ({"ids": ["x"]}, "ids"),
        ({"ids": [1], "dryrun": True}, "dryrun"),
        ({"filter": {}}, "filter"),
        ({"filter": {"state": "lost"}}, "filter"),
        ({"filter": {"connector": "x" * 101}}, "filter"),
        ({"filter": {"stat": "failed"}}, "filter"),
        ({"ids": [1], "reason": "x" * 2001}, "reason"),
        ([1, 2], "non_field_errors"),
    ],
)
def test_a_bad_bulk_request_is_a_400_naming_the_field(call, world, body, field):
    status, data = call("admin", "POST", "/api/v1/commands/cancel/", body)
    assert (status, data["error"]) == (400, "invalid")
    assert field in data["fields"]
    world.a.command.refresh_from_db()
    assert world.a.command.state == State.FAILED


def test_an_action_on_a_missing_or_huge_id_is_a_404(call, world):
    for pk in (999999, 2**63, 10**30):
        status, data = call("admin", "POST", f"/api/v1/commands/{pk}/cancel/", {})
        assert (status, data["error"]) == (404, "not_found")
