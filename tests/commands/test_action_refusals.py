"""An act that would change nothing is not offered, and refused when asked for anyway — with what
would help and no audit row — in the admin and the API alike (item 18 of issue 22)."""

from __future__ import annotations

import pytest

from commands.models import AuditEntry, Command
from tests.commands.staff import login_as, make_failed
from tests.commands.test_admin_actions import FAILED_LIST, choose
from tests.staff import api_client, staff_user


@pytest.fixture
def guarded(make_connector):
    """Two failed commands that only an override resends: a non-idempotent connector's and one whose
    outlook is unknown."""
    risky = make_connector("risky", url="http://127.0.0.1:9/")
    safe = make_connector("safe", url="http://127.0.0.1:9/", idempotent=True)
    return [
        make_failed(risky, reason="not-idempotent"),
        make_failed(safe, outlook="", reason="outlook-unknown"),
    ]


def resent() -> int:
    return Command.objects.filter(resend_by__isnull=False).count()


def test_an_operator_is_not_offered_yes_when_nothing_would_be_resent_and_is_told_to_ask_an_admin(
    client, guarded
):
    login_as(client, "operator")
    html = choose(client, FAILED_LIST, "resend_selected", guarded).content.decode()
    assert "<strong>0 will be resent, 2 need an override" in html
    assert 'value="Yes, resend"' not in html
    assert "Nothing would be resent without an override." in html
    assert "Only someone with the override permission (the admin group) can resend" in html
    assert "ask an admin" in html


def test_an_admin_is_offered_yes_with_the_override(client, guarded):
    login_as(client, "admin")
    html = choose(client, FAILED_LIST, "resend_selected", guarded).content.decode()
    assert 'value="Yes, resend"' in html and 'id="id_override"' in html
    assert "ask an admin" not in html


def test_a_reason_without_the_override_ticked_is_refused_with_a_message_and_no_audit_row(client, guarded):
    login_as(client, "admin")
    page = choose(client, FAILED_LIST, "resend_selected", guarded, confirmed=True, reason="checked with them")
    assert page.status_code == 200  # the confirmation again, with the refusal
    html = page.content.decode()
    assert (
        "Nothing to resend: none of the 2 command(s) can be resent; 2 need an override (1 connector not "
        "idempotent, 1 outlook unknown): tick the override and say why sending again is safe."
    ) in html
    assert (resent(), AuditEntry.objects.count()) == (0, 0)


def test_the_api_refuses_an_act_that_would_change_nothing_with_409_and_no_audit_row(guarded):
    operator = api_client(staff_user("operator"))
    body = {"ids": [c.pk for c in guarded], "reason": "checked with them"}
    response = operator.post("/api/v1/commands/resend/", body, format="json")
    assert response.status_code == 409
    assert response.json()["error"] == "nothing_to_do"
    assert response.json()["detail"].endswith(
        "only someone with the override permission (the admin group) can resend them; ask an admin."
    )
    one = operator.post(f"/api/v1/commands/{guarded[0].pk}/resend/", {}, format="json")
    assert (one.status_code, one.json()["error"]) == (409, "nothing_to_do")
    assert (resent(), AuditEntry.objects.count()) == (0, 0)


def test_the_api_dry_run_still_answers_the_plan(guarded):
    operator = api_client(staff_user("operator"))
    response = operator.post(
        "/api/v1/commands/resend/", {"ids": [c.pk for c in guarded], "dry_run": True}, format="json"
    )
    assert (response.status_code, response.json()["will"]) == (200, 0)


def test_an_act_that_changes_some_is_done_and_audited_as_before(client, guarded, make_connector):
    safe = make_connector("retryable", url="http://127.0.0.1:9/", idempotent=True)
    retryable = make_failed(safe, reason="attempts-spent", attempts=3)
    operator = api_client(staff_user("operator"))
    response = operator.post(
        "/api/v1/commands/resend/", {"ids": [retryable.pk, *(c.pk for c in guarded)]}, format="json"
    )
    assert (response.status_code, response.json()["done"]) == (200, 1)
    assert AuditEntry.objects.count() == 1
