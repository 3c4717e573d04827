"""Why a command waits and what happens next, said once (``commands.staff.explain``) and alike in the
failed list, the all-commands list, a command's page and the API (items 1–3 of issue 22)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.urls import reverse

from commands import retry
from commands.staff import actions
from commands.staff.explain import explain
from commands.states import State
from tests.commands.staff import login_as, make_failed
from tests.staff import api_client, staff_user

T0 = datetime(2026, 12, 1, 13, 30, tzinfo=UTC)
FAILED_LIST = reverse("admin:commands_failedcommand_changelist")
ALL_LIST = reverse("admin:commands_command_changelist")


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


@pytest.fixture
def staff(client, db):
    login_as(client, None)
    return client


def page_of(client, command) -> str:
    return client.get(reverse("admin:commands_command_change", args=[command.pk])).content.decode()


def api_row(command) -> dict:
    viewer = User.objects.filter(username="viewer").first() or staff_user("viewer")
    client = api_client(viewer)
    return client.get(f"/api/v1/commands/?state={command.state}").json()["results"][0]


def test_after_the_last_again_try_it_says_no_tries_left_and_waits_for_a_person(staff, make_connector, clock):
    # The third try failed: the seed's decision backs off once more (the wait before attempts-spent).
    decision = retry.decide(
        dispatchable=True, outlook="again", attempts=3, next_attempt_at=T0 + timedelta(minutes=10),
        idempotent=True, now=T0,
    )  # fmt: skip
    assert decision.skip == "backing-off"
    command = make_failed(
        make_connector(idempotent=True), outlook="again", reason=decision.skip, attempts=3,
        next_attempt_at=T0 + timedelta(minutes=10),
    )  # fmt: skip
    line = "the last of 3 tries failed; no tries left — waits for a person from 2026-12-01 13:40 UTC"
    assert explain(command).line() == line
    listing = staff.get(FAILED_LIST).content.decode()
    rows = listing.split('id="result_list"')[1]  # past the legend, which explains every reason once
    assert line in rows and "no tries left" in rows
    assert "nothing to do" not in rows and "goes again" not in rows
    assert "none: waits for a person" in rows  # no next check
    why = api_row(command)["why"]
    assert (why["text"], why["by"], why["next_check"], why["key"]) == (line, "person", None, "backing-off")


def test_while_tries_are_left_it_says_which_try_comes_and_when(staff, make_connector, clock):
    command = make_failed(
        make_connector(idempotent=True), outlook="again", reason="backing-off", attempts=1,
        next_attempt_at=T0 + timedelta(minutes=2),
    )  # fmt: skip
    line = "try 1 of 3 failed: the receiver wobbled — try 2 of 3 is made at 2026-12-01 13:32 UTC"
    assert line in staff.get(FAILED_LIST).content.decode()
    why = api_row(command)["why"]
    assert (why["text"], why["by"], why["next_check"]) == (line, "machine", "2026-12-01T13:32:00Z")


def test_a_pending_resend_says_a_person_resent_it_and_when_it_goes(staff, make_connector, clock):
    command = make_failed(
        make_connector(idempotent=True), outlook="again", reason="attempts-spent", attempts=3
    )
    actions.perform("resend", command.__class__.objects.filter(pk=command.pk), user=staff_user("operator"),
                    via="admin", now=T0)  # fmt: skip
    command.refresh_from_db()
    # A lone resend is due at once (the commit wakes the dispatchers): "the next round".
    assert (command.next_attempt_at, command.skip_reason) == (T0, "")
    line = "a person resent it — goes once at the next round"
    listing = staff.get(FAILED_LIST).content.decode()
    assert "resend pending" in listing and line in listing
    why = api_row(command)["why"]
    assert (why["key"], why["text"]) == ("resend-pending", line)
    assert api_row(command)["skip_explanation"] == line


def test_an_after_fix_command_s_page_says_after_fix_once_not_beside_backing_off(staff, make_connector, clock):
    command = make_failed(
        make_connector(url="http://127.0.0.1:9/", idempotent=True), outlook="after-fix",
        reason="backing-off", next_attempt_at=T0 + timedelta(minutes=10),
    )  # fmt: skip
    html = page_of(staff, command)
    assert "after fix" in html and "checked again at 2026-12-01 13:40 UTC" in html
    assert "Skip reason" not in html and "backing off" not in html


def test_the_badge_and_the_stored_reason_use_one_word_for_an_unknown_outlook(staff, make_connector, clock):
    command = make_failed(make_connector(idempotent=True), outlook="", reason="outlook-unknown")
    html = page_of(staff, command)
    assert "outlook unknown" in html and "outcome unknown" not in html
    assert api_row(command)["why"]["label"] == "outlook unknown"


def test_a_command_nobody_will_check_again_shows_no_past_next_check(
    staff, make_connector, make_command, clock
):
    connector = make_connector(idempotent=True)
    past = T0 - timedelta(hours=1)
    done = make_command(connector, state=State.SUCCEEDED, attempts=1, next_attempt_at=past)
    never = make_failed(
        connector, outlook="never", reason="never", next_attempt_at=past, skip_decided_at=past
    )
    listing = staff.get(ALL_LIST).content.decode()
    assert '<td class="field-next_check">none: waits for a person</td>' in listing
    assert '<td class="field-next_check">-</td>' in listing
    assert f"{past:%Y-%m-%d %H:%M:%S}" not in listing
    assert api_row(done)["why"]["next_check"] is None and api_row(done)["why"]["by"] == "nobody"
    assert api_row(never)["why"]["next_check"] is None


@pytest.mark.parametrize(
    ("outlook", "reason", "state", "hint"),
    [
        ("after-fix", "backing-off", State.FAILED, True),
        ("again", "not-idempotent", State.FAILED, True),
        ("never", "never", State.FAILED, False),
        ("", "outlook-unknown", State.FAILED, False),
        ("", "", State.SUCCEEDED, False),
    ],
)
def test_the_fix_hint_appears_only_where_editing_the_connector_helps(
    staff, make_connector, clock, outlook, reason, state, hint
):
    command = make_failed(make_connector(url="http://127.0.0.1:9/"), outlook=outlook, reason=reason)
    command.__class__.objects.filter(pk=command.pk).update(state=state)
    html = page_of(staff, command)
    assert ("Edit it to release this command" in html) is hint


def test_the_connector_on_a_page_counts_its_commands_that_wait_for_a_fix(staff, make_connector, clock):
    connector = make_connector(url="http://127.0.0.1:9/", idempotent=True)  # no problem in its settings
    commands = [
        make_failed(
            connector, outlook="after-fix", reason="backing-off", last_error="HTTP 401 from the receiver"
        )
        for _ in range(3)
    ]
    html = page_of(staff, commands[0])
    assert "3 of its failed commands wait for a configuration fix" in html
    assert "none found" not in html


@pytest.mark.parametrize(
    ("state", "line", "by"),
    [
        (State.DRAFT, "a draft — waits for a person to approve it", "person"),
        (State.APPROVED, "approved, its first attempt not made yet — sent at the next round", "machine"),
        (State.QUEUED, "queued for its send — sent at the next dispatch poll", "machine"),
        (State.DISPATCHING, "being sent — its outcome is recorded when the send ends", "nobody"),
        (State.CANCELLED, "cancelled: finished — nothing happens any more", "nobody"),
    ],
)
def test_a_command_that_is_not_failed_says_what_comes_next_too(
    staff, make_connector, make_command, state, line, by
):
    command = make_command(make_connector(kind="log"), state=state)
    assert line in staff.get(ALL_LIST).content.decode()
    why = api_row(command)["why"]
    assert (why["text"], why["by"]) == (line, by)
