"""A command's page: its actions (each through the list's confirmation, with the dry run), its
attempts newest first with the receiver's answer and who sent it, each linked to its own page."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from django.utils import timezone

from commands.models import Attempt, AuditEntry, Command
from commands.staff import actions
from commands.states import State
from tests.commands.staff import login_as, make_failed


@pytest.fixture
def operator(client, db):
    user = login_as(client, "operator")
    return client, user


def page_of(client, command, model="command"):
    response = client.get(reverse(f"admin:commands_{model}_change", args=[command.pk]))
    assert response.status_code == 200
    return response.content.decode()


def offered(html: str) -> list[str]:
    return re.findall(r'<button type="submit" class="button" name="ankusa-(\w+)">', html)


@pytest.mark.parametrize("model", ["command", "failedcommand"])
def test_a_failed_command_offers_resend_and_cancel_with_their_dry_runs(operator, make_connector, model):
    client, _ = operator
    command = make_failed(make_connector(url="http://127.0.0.1:9/", idempotent=True), reason="attempts-spent")
    html = page_of(client, command, model)
    assert offered(html) == ["resend", "cancel"]
    one = Command.objects.filter(pk=command.pk)
    assert f"dry run: {actions.plan('resend', one).summary()}" in html
    assert f"dry run: {actions.plan('cancel', one).summary()}" in html
    assert actions.plan("resend", one).will == 1
    # Each button posts the one id to the command list's own action.
    assert f'action="{reverse("admin:commands_command_changelist")}?id__exact={command.pk}"' in html
    assert f'name="_selected_action" value="{command.pk}"' in html


def test_a_draft_offers_approve_and_cancel_and_a_finished_command_nothing(
    operator, make_connector, make_command
):
    client, _ = operator
    connector = make_connector(url="http://127.0.0.1:9/")
    draft = make_command(connector, state=State.DRAFT)
    done = make_command(connector, state=State.SUCCEEDED)
    assert offered(page_of(client, draft)) == ["approve", "cancel"]
    html = page_of(client, done)
    assert offered(html) == []
    assert 'id="ankusa-command-actions"' not in html


def test_a_viewer_is_offered_no_action(client, db, make_connector):
    login_as(client, "viewer")
    command = make_failed(make_connector(url="http://127.0.0.1:9/", idempotent=True))
    assert offered(page_of(client, command)) == []


def test_a_resend_needing_an_override_is_offered_only_to_who_may_override(client, db, make_connector):
    command = make_failed(
        make_connector(url="http://127.0.0.1:9/", idempotent=False), reason="not-idempotent"
    )
    login_as(client, "operator")
    assert offered(page_of(client, command)) == ["cancel"]
    login_as(client, "admin", "ops-admin")
    html = page_of(client, command)
    assert offered(html) == ["resend", "cancel"]
    # The dry run's own words (commands.staff.actions), for the one command.
    assert f"dry run: {actions.plan('resend', Command.objects.filter(pk=command.pk)).summary()}" in html
    assert "need an override" in html


def test_the_button_leads_to_the_confirmation_and_yes_resends_that_one_command(operator, make_connector):
    client, user = operator
    connector = make_connector(url="http://127.0.0.1:9/", idempotent=True)
    command = make_failed(connector, reason="attempts-spent")
    other = make_failed(connector, reason="attempts-spent")
    url = reverse("admin:commands_command_changelist") + f"?id__exact={command.pk}"
    form = {"action": "resend_selected", "_selected_action": str(command.pk), "select_across": "0"}
    confirm = client.post(url, {**form, "index": "0"})
    assert confirm.status_code == 200
    html = confirm.content.decode()
    assert '<strong id="ankusa-total">1</strong>' in html
    assert "1 will be resent" in html
    command.refresh_from_db()
    assert command.resend_by_id is None  # asking changed nothing
    done = client.post(url, {**form, "confirmed": "yes", "reason": ""})
    assert done.status_code == 302
    assert done["Location"] == url  # back to the list, narrowed to this command
    command.refresh_from_db()
    other.refresh_from_db()
    assert (command.resend_by_id, other.resend_by_id) == (user.pk, None)
    assert list(AuditEntry.objects.get().commands.values_list("pk", flat=True)) == [command.pk]


def test_attempts_are_newest_first_with_the_answer_and_who_sent_each_linked_to_its_page(
    operator, make_connector
):
    client, user = operator
    command = make_failed(make_connector(url="http://127.0.0.1:9/"), reason="attempts-spent", attempts=2)
    now = timezone.now()
    first = Attempt.objects.create(
        command=command,
        number=1,
        started_at=now,
        finished_at=now,
        ok=False,
        outlook="again",
        status_code=503,
        response_excerpt="<h1>upstream overloaded</h1>",
    )
    second = Attempt.objects.create(
        command=command,
        number=2,
        started_at=now,
        finished_at=now,
        ok=False,
        outlook="again",
        status_code=502,
        response_excerpt="bad gateway " + "x" * 400,
        manual=True,
        manual_by=user,
    )
    html = page_of(client, command)
    rows = re.findall(r'<tr class="ankusa-attempt">(.*?)</tr>', html)
    assert len(rows) == 2
    newest, oldest = rows
    assert f'href="{reverse("admin:commands_attempt_change", args=[second.pk])}">#2</a>' in newest
    assert f'href="{reverse("admin:commands_attempt_change", args=[first.pk])}">#1</a>' in oldest
    assert f"resent by {user.username}" in newest and "the loop" in oldest
    assert "&lt;h1&gt;upstream overloaded&lt;/h1&gt;" in oldest  # escaped, never markup
    assert "bad gateway " + "x" * 100 in newest and "x" * 200 not in newest  # an excerpt, cut


def test_the_attempt_list_is_newest_first(admin_client, make_connector):
    command = make_failed(make_connector(url="http://127.0.0.1:9/"))
    now = timezone.now()
    ids = [Attempt.objects.create(command=command, number=n, started_at=now).pk for n in (1, 2, 3)]
    html = admin_client.get(reverse("admin:commands_attempt_changelist")).content.decode()
    shown = [int(pk) for pk in re.findall(r'href="/admin/commands/attempt/(\d+)/change/', html)]
    assert shown == ids[::-1]


def test_a_command_has_no_delete_button_or_page(admin_client, make_connector):
    command = make_failed(make_connector(url="http://127.0.0.1:9/"))
    html = page_of(admin_client, command)
    assert "deletelink" not in html
    response = admin_client.get(reverse("admin:commands_command_delete", args=[command.pk]))
    assert response.status_code == 403
    assert Command.objects.filter(pk=command.pk).exists()
