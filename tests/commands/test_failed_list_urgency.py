"""The failed list puts what needs a person first and says so; its counts are exact up to the cap
and honest past it, in the list, the selection and the confirmation alike (items 5, 6 and 8 of
issue 22)."""

from __future__ import annotations

import pytest
from django.contrib.admin import helpers
from django.urls import reverse

from commands.models import Command
from commands.staff.admin_lists import CappedPaginator
from commands.states import State
from tests.commands.staff import login_as, make_failed

LIST = reverse("admin:commands_failedcommand_changelist")


@pytest.fixture
def staff(client, db):
    login_as(client, None)
    return client


def test_what_needs_a_person_comes_first_then_the_oldest(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", idempotent=True)
    wobble = make_failed(connector, outlook="again", reason="backing-off", attempts=1)
    never_old = make_failed(connector, outlook="never", reason="never")
    never_new = make_failed(connector, outlook="never", reason="never")
    fix = make_failed(connector, outlook="after-fix", reason="backing-off")
    last_try = make_failed(connector, outlook="again", reason="backing-off", attempts=3)
    spent = make_failed(connector, outlook="again", reason="attempts-spent", attempts=3)
    unknown = make_failed(connector, outlook="", reason="outlook-unknown")
    plain = make_failed(connector, outlook="again", reason="not-idempotent")
    page = staff.get(LIST)
    assert [c.pk for c in page.context["cl"].result_list] == [
        unknown.pk, plain.pk, last_try.pk, spent.pk, fix.pk, never_old.pk, never_new.pk, wobble.pk,
    ]  # fmt: skip
    html = page.content.decode()
    assert 'id="ankusa-order">Ordered by what needs a person first — 1. a person decides' in html
    assert "then oldest first" in html
    # The header marks the "why it waits" column as the first sort key, the id as the second.
    assert 'class="sortable column-why_first sorted ascending"' in html
    assert '<span class="sortpriority" title="Sorting priority: 1">1</span>' in html


def test_not_idempotent_rows_stay_within_the_first_page_whatever_the_never_rows(
    staff, make_connector, monkeypatch
):
    monkeypatch.setattr(CappedPaginator, "CAP", 5)
    connector = make_connector(url="http://127.0.0.1:9/")
    for _ in range(8):
        make_failed(connector, outlook="never", reason="never")
    plain = make_failed(connector, outlook="again", reason="not-idempotent")
    listed = [c.pk for c in staff.get(LIST).context["cl"].result_list]
    assert listed[0] == plain.pk


def test_past_the_cap_the_count_search_and_selection_say_more_than_and_the_confirmation_counts_all(
    staff, make_connector, monkeypatch
):
    monkeypatch.setattr(CappedPaginator, "CAP", 3)
    connector = make_connector(url="http://127.0.0.1:9/")
    for _ in range(5):
        make_failed(connector, outlook="never", reason="never")
    html = staff.get(LIST, {"q": "HTTP 503"}).content.decode()
    assert "more than 3 results" in html and "3 results" not in html.replace("more than 3 results", "")
    assert "All matching failed commands selected: more than 3" in html
    assert "All 3 selected" not in html
    confirm = staff.post(
        LIST,
        {
            "action": "cancel_selected",
            "select_across": "1",
            helpers.ACTION_CHECKBOX_NAME: ["1"],
            "index": "0",
        },
    ).content.decode()
    assert 'id="ankusa-total">5<' in confirm
    assert "everything that matches the filter, counted whole (the list pages only the first 3)" in confirm


def test_up_to_the_cap_the_counts_are_exact(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    for _ in range(2):
        make_failed(connector, outlook="never", reason="never")
    html = staff.get(LIST, {"q": "HTTP 503"}).content.decode()
    assert "2 results" in html and "more than" not in html


def test_a_command_that_left_the_failed_list_opens_on_the_command_list(staff, make_connector, make_command):
    done = make_command(make_connector(kind="log"), state=State.SUCCEEDED, attempts=2)
    response = staff.get(reverse("admin:commands_failedcommand_change", args=[done.pk]), follow=True)
    assert response.redirect_chain == [(reverse("admin:commands_command_change", args=[done.pk]), 302)]
    html = response.content.decode()
    assert f"Command {done.pk} is not failed any more (succeeded)." in html
    assert "doesn’t exist" not in html and "doesn't exist" not in html


def test_a_command_that_never_existed_is_still_not_found(staff, db):
    response = staff.get(reverse("admin:commands_failedcommand_change", args=[987654]), follow=True)
    assert not Command.objects.exists()
    assert "doesn’t exist" in response.content.decode()


def test_within_one_reason_the_oldest_comes_first_and_no_urgency_note_is_shown(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/", idempotent=True)
    undecided = make_failed(connector, outlook="after-fix", reason="")
    older = make_failed(connector, outlook="after-fix", reason="backing-off")
    newer = make_failed(connector, outlook="after-fix", reason="backing-off")
    page = staff.get(LIST, {"reason": "after-fix"})
    assert [c.pk for c in page.context["cl"].result_list] == [older.pk, newer.pk, undecided.pk]
    assert 'id="ankusa-order"' not in page.content.decode()
