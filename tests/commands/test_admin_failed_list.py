"""The failed-command list: why each command waits, filters, search, a capped count, constant queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from commands.models import Command, Connector
from commands.staff.admin_lists import CappedPaginator
from commands.states import State
from limits.models import Tenant
from tests.commands.staff import login_as, make_failed

LIST = reverse("admin:commands_failedcommand_changelist")


@pytest.fixture
def staff(client, db):
    login_as(client, None)
    return client


def ids_on(page) -> set[int]:
    return {obj.pk for obj in page.context["cl"].result_list}


def test_the_failed_list_shows_only_failed_commands_with_their_reason_explained(
    staff, make_connector, make_command
):
    connector = make_connector(url="http://127.0.0.1:9/")
    waiting = make_failed(connector, outlook="after-fix", reason="backing-off")
    unknown = make_failed(connector, outlook="", reason="outlook-unknown")
    make_command(connector)  # approved: not on this list
    page = staff.get(LIST)
    assert page.status_code == 200
    assert ids_on(page) == {waiting.pk, unknown.pk}
    html = page.content.decode()
    assert 'class="ankusa-badge ankusa-tone-fix"' in html
    assert "the receiver asks for a configuration fix — checked again at the next round" in html
    assert "whether it went out is unknown" in html
    assert "<code>HTTPStatus</code> HTTP 503 from the receiver" in html


def test_the_after_fix_filter_finds_commands_waiting_for_a_fix_even_while_backing_off(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    backing_off = make_failed(connector, outlook="after-fix", reason="backing-off")
    undecided = make_failed(connector, outlook="after-fix", reason="")
    wobble = make_failed(connector, outlook="again", reason="backing-off")
    assert ids_on(staff.get(LIST, {"reason": "after-fix"})) == {backing_off.pk, undecided.pk}
    assert ids_on(staff.get(LIST, {"reason": "backing-off"})) == {wobble.pk}


def test_each_filter_narrows_the_list(staff, tenant, make_connector):
    one = make_connector("one", url="http://127.0.0.1:9/")
    other_tenant = Tenant.objects.create(slug="other", name="Other")
    two = Connector.objects.create(tenant=other_tenant, name="two", kind="log")
    old = make_failed(one, outlook="never", reason="never", last_error_class="Configuration")
    Command.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))
    new = make_failed(two, outlook="again", reason="attempts-spent")
    cases = {
        "tenant__id__exact": (tenant.pk, {old.pk}),
        "connector__id__exact": (two.pk, {new.pk}),
        "reason": ("never", {old.pk}),
        "last_outlook__exact": ("again", {new.pk}),
        "last_error_class": ("Configuration", {old.pk}),
        "age": ("7d", {old.pk}),
    }
    for parameter, (value, expected) in cases.items():
        page = staff.get(LIST, {parameter: value})
        assert page.status_code == 200, parameter
        assert ids_on(page) == expected, parameter
    assert ids_on(staff.get(LIST, {"age": "1h"})) == {new.pk}
    filters = staff.get(LIST).content.decode()
    assert "acme/one" in filters and "other/two" in filters  # connectors named by tenant slug


def test_search_finds_by_id_idempotency_key_and_error_text(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    keyed = make_failed(connector, idempotency_key="order-77")
    texty = make_failed(connector, last_error="the receiver said: quota exhausted")
    assert ids_on(staff.get(LIST, {"q": str(keyed.pk)})) == {keyed.pk}
    assert ids_on(staff.get(LIST, {"q": "order-77"})) == {keyed.pk}
    assert ids_on(staff.get(LIST, {"q": "quota exhausted"})) == {texty.pk}


@pytest.mark.parametrize(
    "query",
    [
        {"q": "not-a-number"},
        {"age": "forever"},
        {"reason": "<script>"},
        {"audit": "x"},
        {"last_outlook__exact": "bogus"},
        {"tenant__id__exact": "abc"},
        {"p": "999"},
        {"o": "zz"},
    ],
)
def test_bad_filter_values_never_give_a_500(staff, make_connector, query):
    make_failed(make_connector(url="http://127.0.0.1:9/"))
    assert staff.get(LIST, query).status_code in (200, 302)


def test_the_failed_list_costs_the_same_queries_for_10_and_1000_commands(staff, tenant, make_connector):
    connectors = [make_connector(f"c{i}", url="http://127.0.0.1:9/") for i in range(3)]

    def fill(n):
        Command.objects.bulk_create(
            [
                Command(
                    tenant=tenant,
                    connector=connectors[i % 3],
                    state=State.FAILED,
                    last_outlook=["again", "after-fix", "never", ""][i % 4],
                    skip_reason=["attempts-spent", "backing-off", "never", "outlook-unknown"][i % 4],
                    last_error_class=f"Error{i % 5}",
                    last_error="boom",
                    attempts=1,
                )
                for i in range(n)
            ]
        )

    def queries(**query):
        with CaptureQueriesContext(connection) as captured:
            page = staff.get(LIST, query)
            assert page.status_code == 200
        return len(captured)

    fill(10)
    few = [queries(), queries(reason="after-fix"), queries(q="boom")]
    fill(990)
    assert [queries(), queries(reason="after-fix"), queries(q="boom")] == few


def test_a_count_past_the_cap_says_more_than(staff, make_connector, monkeypatch):
    monkeypatch.setattr(CappedPaginator, "CAP", 3)
    connector = make_connector(url="http://127.0.0.1:9/")
    for _ in range(5):
        make_failed(connector)
    html = staff.get(LIST).content.decode()
    assert "more than 3 failed commands" in html


def test_a_viewer_sees_the_list_and_no_action_that_changes_state(client, make_connector):
    login_as(client, "viewer")
    make_failed(make_connector(url="http://127.0.0.1:9/"))
    page = client.get(LIST)
    assert page.status_code == 200
    assert "resend_selected" not in page.content.decode()
    assert "cancel_selected" not in page.content.decode()


def test_an_operator_is_offered_resend_cancel_and_new_command_but_not_delete(client, make_connector):
    login_as(client, "operator")
    make_failed(make_connector(url="http://127.0.0.1:9/"))
    html = client.get(LIST).content.decode()
    for action in ("resend_selected", "cancel_selected", "new_command_selected"):
        assert f'value="{action}"' in html
    assert "delete_selected" not in html
