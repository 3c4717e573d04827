"""Staff actions through the admin: a dry run first, state changes only by a confirmed POST, and each
group allowed exactly what ``commands.staff.staff_groups`` grants."""

from __future__ import annotations

import pytest
from django.contrib.admin import helpers
from django.urls import reverse

from commands.models import AuditEntry, Command
from commands.states import State
from tests.commands.staff import login_as, make_failed

FAILED_LIST = reverse("admin:commands_failedcommand_changelist")
COMMAND_LIST = reverse("admin:commands_command_changelist")


def choose(client, url, action, commands, *, confirmed=False, select_across=False, query="", **fields):
    data = {
        "action": action,
        helpers.ACTION_CHECKBOX_NAME: [str(c.pk) for c in commands],
        "select_across": "1" if select_across else "0",
        **fields,
    }
    if confirmed:
        data["confirmed"] = "yes"
    else:
        data["index"] = "0"  # the change list's own "Go" button
    return client.post(url + query, data)


@pytest.fixture
def mixed(make_connector):
    """Five failed commands: 2 resendable, 1 non-idempotent, 1 unknown outcome, 1 never."""
    safe = make_connector("safe", url="http://127.0.0.1:9/", idempotent=True)
    risky = make_connector("risky", url="http://127.0.0.1:9/", idempotent=False)
    return {
        "ok": [make_failed(safe, reason="attempts-spent"), make_failed(safe, reason="attempts-spent")],
        "not_idempotent": make_failed(risky, reason="not-idempotent"),
        "unknown": make_failed(safe, outlook="", reason="outlook-unknown"),
        "never": make_failed(safe, outlook="never", reason="never"),
    }


def everything(mixed) -> list[Command]:
    return [*mixed["ok"], mixed["not_idempotent"], mixed["unknown"], mixed["never"]]


def states(commands) -> list[tuple]:
    return list(
        Command.objects.filter(pk__in=[c.pk for c in commands])
        .order_by("pk")
        .values_list("state", "resend_by", "skip_reason")
    )


def test_choosing_resend_shows_the_dry_run_breakdown_and_changes_nothing(client, mixed):
    login_as(client, "operator")
    before = states(everything(mixed))
    page = choose(client, FAILED_LIST, "resend_selected", everything(mixed))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="ankusa-total">5<' in html
    assert "<strong>2 will be resent, 2 need an override" in html
    assert "<li>2 will be resent</li>" in html
    assert "need an override" in html
    assert "connector not idempotent" in html
    assert "outlook unknown" in html
    assert "never: make a new command instead" in html
    assert 'name="override"' not in html  # an operator holds no override permission
    assert states(everything(mixed)) == before
    assert not AuditEntry.objects.exists()


def test_a_confirmed_resend_resends_the_eligible_ones_and_writes_an_audit_row(client, mixed):
    user = login_as(client, "operator")
    response = choose(
        client, FAILED_LIST, "resend_selected", everything(mixed), confirmed=True, reason="fixed"
    )
    assert response.status_code == 302
    resent = Command.objects.filter(resend_by=user)
    assert set(resent.values_list("pk", flat=True)) == {c.pk for c in mixed["ok"]}
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.via, entry.username, entry.count, entry.done, entry.reason) == (
        "resend",
        "admin",
        "operator",
        5,
        2,
        "fixed",
    )
    assert set(entry.commands.values_list("pk", flat=True)) == {c.pk for c in mixed["ok"]}  # the changed ones
    assert entry.result["skipped"] == {
        "connector not idempotent": 1,
        "outlook unknown": 1,
        "never: make a new command instead": 1,
    }


def test_select_across_acts_on_everything_matching_the_filter(client, make_connector):
    user = login_as(client, "operator")
    safe = make_connector("safe", url="http://127.0.0.1:9/", idempotent=True)
    matching = [make_failed(safe, reason="attempts-spent") for _ in range(3)]
    other = make_failed(safe, outlook="never", reason="never")
    # Only one row ticked on the page, "select all" clicked, the filter in the URL.
    page = choose(
        client,
        FAILED_LIST,
        "resend_selected",
        matching[:1],
        select_across=True,
        query="?reason=attempts-spent",
    )
    assert 'id="ankusa-total">3<' in page.content.decode()
    response = choose(
        client,
        FAILED_LIST,
        "resend_selected",
        matching[:1],
        select_across=True,
        confirmed=True,
        query="?reason=attempts-spent",
    )
    assert response.status_code == 302
    assert set(Command.objects.filter(resend_by=user).values_list("pk", flat=True)) == {
        c.pk for c in matching
    }
    other.refresh_from_db()
    assert other.resend_by is None


def test_a_get_never_changes_state(client, mixed):
    login_as(client, None)
    before = states(everything(mixed))
    query = {"action": "resend_selected", "select_across": "1", "confirmed": "yes", "override": "on"}
    assert client.get(FAILED_LIST, query).status_code in (200, 302)  # an unknown parameter: ?e=1
    new_command = reverse("admin:commands_failedcommand_new_command", args=[mixed["never"].pk])
    assert client.get(new_command, {"payload": "{}"}).status_code == 200
    assert states(everything(mixed)) == before
    assert not AuditEntry.objects.exists()


def test_a_viewer_cannot_resend(client, mixed):
    login_as(client, "viewer")
    before = states(everything(mixed))
    response = choose(client, FAILED_LIST, "resend_selected", everything(mixed), confirmed=True)
    # The viewer has no action at all: the POST is not taken for one, the list comes back.
    assert response.status_code == 200
    assert "resend_selected" not in response.content.decode()
    assert states(everything(mixed)) == before
    assert not AuditEntry.objects.exists()


def test_an_operator_cannot_override(client, mixed):
    login_as(client, "operator")
    before = states(everything(mixed))
    response = choose(
        client,
        FAILED_LIST,
        "resend_selected",
        everything(mixed),
        confirmed=True,
        override="on",
        reason="sure",
    )
    assert response.status_code == 403
    assert states(everything(mixed)) == before
    assert not AuditEntry.objects.exists()


def test_an_admin_is_offered_the_override_and_needs_a_typed_reason(client, mixed):
    login_as(client, "admin")
    page = choose(client, FAILED_LIST, "resend_selected", everything(mixed))
    html = page.content.decode()
    assert 'name="override"' in html
    assert "With an override:" in html
    before = states(everything(mixed))
    refused = choose(client, FAILED_LIST, "resend_selected", everything(mixed), confirmed=True, override="on")
    assert refused.status_code == 200  # the page again, with the refusal
    assert states(everything(mixed)) == before


def test_an_admin_can_resend_with_an_override_and_a_reason(client, mixed):
    user = login_as(client, "admin")
    response = choose(
        client,
        FAILED_LIST,
        "resend_selected",
        everything(mixed),
        confirmed=True,
        override="on",
        reason="checked the receiver: nothing arrived",
    )
    assert response.status_code == 302
    resent = set(Command.objects.filter(resend_by=user).values_list("pk", flat=True))
    assert {mixed["not_idempotent"].pk, mixed["unknown"].pk, *(c.pk for c in mixed["ok"])} <= resent
    assert mixed["never"].pk not in resent
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.reason) == ("resend-override", "checked the receiver: nothing arrived")


def test_an_operator_approves_drafts_from_the_command_list(client, make_connector, make_command):
    user = login_as(client, "operator")
    connector = make_connector(kind="log")
    draft = make_command(connector, state=State.DRAFT)
    approved = make_command(connector)
    page = choose(client, COMMAND_LIST, "approve_selected", [draft, approved])
    assert "1 will be approved" in page.content.decode()
    draft.refresh_from_db()
    assert draft.state == State.DRAFT
    assert (
        choose(client, COMMAND_LIST, "approve_selected", [draft, approved], confirmed=True).status_code == 302
    )
    draft.refresh_from_db()
    assert (draft.state, draft.approved_by) == (State.APPROVED, user)
    assert AuditEntry.objects.get().action == "approve"


def test_a_viewer_cannot_approve_or_cancel(client, make_connector, make_command):
    login_as(client, "viewer")
    draft = make_command(make_connector(kind="log"), state=State.DRAFT)
    for action in ("approve_selected", "cancel_selected"):
        choose(client, COMMAND_LIST, action, [draft], confirmed=True)
    draft.refresh_from_db()
    assert draft.state == State.DRAFT
    assert not AuditEntry.objects.exists()


def test_an_operator_cancels_after_the_dry_run(client, mixed):
    login_as(client, "operator")
    target = mixed["never"]
    page = choose(client, FAILED_LIST, "cancel_selected", [target])
    assert "1 will be cancelled" in page.content.decode()
    target.refresh_from_db()
    assert target.state == State.FAILED
    choose(client, FAILED_LIST, "cancel_selected", [target], confirmed=True)
    target.refresh_from_db()
    assert target.state == State.CANCELLED
    assert AuditEntry.objects.get().action == "cancel"


def test_make_a_new_command_with_an_edited_payload_linked_to_the_original(client, mixed):
    login_as(client, "operator")
    original = mixed["never"]
    chosen = choose(client, FAILED_LIST, "new_command_selected", [original])
    url = reverse("admin:commands_failedcommand_new_command", args=[original.pk])
    assert chosen.status_code == 302 and chosen["Location"] == url
    form = client.get(url)
    assert "will be cancelled" in form.content.decode()
    assert "&quot;order&quot;: &quot;A-1&quot;" in form.content.decode()  # pretty, escaped JSON
    response = client.post(url, {"payload": '{"order": "A-2"}', "reason": "typo in the order id"})
    assert response.status_code == 302
    copy = Command.objects.get(resent_from=original)
    assert (copy.payload, copy.state) == ({"order": "A-2"}, State.APPROVED)
    assert response["Location"] == reverse("admin:commands_command_change", args=[copy.pk])
    original.refresh_from_db()
    assert original.state == State.CANCELLED


def test_a_new_command_with_bad_json_shows_the_form_again(client, mixed):
    login_as(client, "operator")
    url = reverse("admin:commands_failedcommand_new_command", args=[mixed["never"].pk])
    response = client.post(url, {"payload": "{not json", "reason": ""})
    assert response.status_code == 200
    assert "Enter a valid JSON." in response.content.decode()
    assert not Command.objects.filter(resent_from=mixed["never"]).exists()


def test_a_new_command_is_refused_for_a_command_that_is_not_failed(client, make_connector, make_command):
    login_as(client, "operator")
    command = make_command(make_connector(kind="log"))
    url = reverse("admin:commands_command_new_command", args=[command.pk])
    assert "not failed" in client.get(url).content.decode()
    response = client.post(url, {"payload": "{}", "reason": ""})
    assert response.status_code == 200
    assert not Command.objects.filter(resent_from=command).exists()


def test_a_viewer_cannot_open_the_new_command_form(client, mixed):
    login_as(client, "viewer")
    url = reverse("admin:commands_failedcommand_new_command", args=[mixed["never"].pk])
    assert client.get(url).status_code == 403
    assert client.post(url, {"payload": "{}"}).status_code == 403


def test_new_command_from_a_selection_of_two_asks_for_one(client, mixed):
    login_as(client, "operator")
    response = choose(client, FAILED_LIST, "new_command_selected", mixed["ok"], confirmed=True)
    assert response.status_code == 302
    assert response["Location"].startswith(FAILED_LIST)


@pytest.mark.parametrize(
    "data",
    [
        {"action": "resend_selected", helpers.ACTION_CHECKBOX_NAME: ["abc"], "index": "0"},
        {"action": "resend_selected", helpers.ACTION_CHECKBOX_NAME: ["1", "x"], "confirmed": "yes"},
        {
            "action": "resend_selected",
            helpers.ACTION_CHECKBOX_NAME: ["1;2"],
            "confirmed": "yes",
            "select_across": "0",
        },
        {"action": "no_such_action", helpers.ACTION_CHECKBOX_NAME: ["1"], "index": "0"},
        {"action": "resend_selected", helpers.ACTION_CHECKBOX_NAME: ["99999"], "confirmed": "yes"},
    ],
)
def test_a_forged_action_post_never_gives_a_500_and_changes_nothing(client, mixed, data):
    login_as(client, "admin")
    before = states(everything(mixed))
    assert client.post(FAILED_LIST, data).status_code in (200, 302)
    assert states(everything(mixed)) == before


def test_a_confirmed_action_whose_reason_holds_a_nul_changes_nothing_and_says_why(client, mixed):
    login_as(client, "operator")
    before = states(everything(mixed))
    response = choose(
        client, FAILED_LIST, "cancel_selected", everything(mixed), confirmed=True, reason="fixed\x00"
    )
    assert response.status_code == 200  # the confirmation page again, with the refusal on it
    assert "The reason holds a NUL character" in response.content.decode()
    assert states(everything(mixed)) == before
    assert not AuditEntry.objects.exists()
