"""Connectors at a glance: URL, recent success rate, failing and waiting counts, last error and when,
each linked to the filtered list — on the list and the page, at a cost that does not grow per row."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from commands import health
from commands.models import Attempt, Command
from commands.staff import connector_glance
from commands.states import State
from tests.commands.staff import make_failed

LIST = reverse("admin:commands_connector_changelist")
FAILED = reverse("admin:commands_failedcommand_changelist")


@pytest.fixture
def staff(admin_client):
    return admin_client


def row_of(html: str, name: str) -> str:
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        if f"/{name}</a>" in row:  # the list names a connector tenant/name
            return row
    raise AssertionError(f"no row for {name}")


def test_the_list_shows_url_rate_counts_and_last_error_each_linked(staff, make_connector, make_command):
    crm = make_connector("crm", url="https://crm.example.com/hooks/orders")
    make_connector("quiet", url="https://quiet.example.com/")
    old = make_failed(crm, last_error_class="HTTPStatus", last_error="HTTP 503 from the receiver")
    Command.objects.filter(pk=old.pk).update(state_changed_at=timezone.now() - timedelta(hours=2))
    newest = make_failed(crm, last_error_class="HTTPStatus", last_error="HTTP 401 from the receiver")
    make_command(crm, state=State.APPROVED)
    make_command(crm, state=State.QUEUED)
    make_command(crm, state=State.SUCCEEDED)
    now = timezone.now()
    for number, ok in enumerate([True, True, True, False], start=1):
        Attempt.objects.create(command=old, number=number, started_at=now, finished_at=now, ok=ok)
    Attempt.objects.create(  # older than the window: not counted
        command=old, number=9, started_at=now, finished_at=now - timedelta(hours=25), ok=False
    )
    health.backfill()  # attempts written here, not by the recorder: the summary is built from them
    html = staff.get(LIST).content.decode()
    row = row_of(html, "crm")
    assert "https://crm.example.com/hooks/orders" in row
    assert "75% of 4" in row
    failing = FAILED + "?" + urlencode({"connector__id__exact": crm.pk})
    assert f'<a href="{failing.replace("&", "&amp;")}">2</a>' in row
    waiting = (
        reverse("admin:commands_command_changelist")
        + "?"
        + urlencode({"connector__id__exact": crm.pk, "state__in": "approved,queued"})
    )
    assert f'<a href="{waiting.replace("&", "&amp;")}">2</a>' in row
    last = FAILED + "?" + urlencode({"connector__id__exact": crm.pk, "last_error_class": "HTTPStatus"})
    assert (
        f'<a href="{last.replace("&", "&amp;")}"><code>HTTPStatus</code> HTTP 401 from the receiver</a>'
        in row
    )
    assert re.search(r'<span class="ankusa-when">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</span>', row)
    quiet = row_of(html, "quiet")
    assert "HTTP" not in quiet and '">0</a>' in quiet
    assert newest.pk  # the newest failure is the one shown


def test_the_links_lead_to_lists_holding_exactly_those_commands(staff, make_connector, make_command):
    crm = make_connector("crm", url="https://crm.example.com/")
    other = make_connector("other", url="https://other.example.com/")
    mine = {make_failed(crm).pk, make_failed(crm).pk}
    make_failed(other)
    waiting = {make_command(crm, state=State.APPROVED).pk}
    make_command(other, state=State.APPROVED)
    html = staff.get(LIST).content.decode()
    links = re.findall(r'href="([^"]+)"', row_of(html, "crm"))
    failed_link = next(link for link in links if link.startswith(FAILED) and "last_error" not in link)
    waiting_link = next(link for link in links if "state__in" in link)
    for link, expected in ((failed_link, mine), (waiting_link, waiting)):
        page = staff.get(link.replace("&amp;", "&")).content.decode()
        assert set(map(int, re.findall(r'name="_selected_action" value="(\d+)"', page))) == expected


def test_counts_stop_at_the_cap_and_say_more_than(staff, make_connector, monkeypatch):
    monkeypatch.setattr(connector_glance, "CAP", 2)
    crm = make_connector("crm", url="https://crm.example.com/")
    for _ in range(4):
        make_failed(crm)
    assert ">more than 2</a>" in row_of(staff.get(LIST).content.decode(), "crm")


def test_the_connector_page_shows_the_same_glance(staff, make_connector):
    crm = make_connector("crm", url="https://crm.example.com/")
    make_failed(crm, last_error_class="HTTPStatus", last_error="HTTP 401 from the receiver")
    html = staff.get(reverse("admin:commands_connector_change", args=[crm.pk])).content.decode()
    assert '<table class="ankusa-glance">' in html
    assert "HTTP 401 from the receiver" in html
    assert f"connector__id__exact={crm.pk}" in html


def test_the_list_costs_the_same_queries_for_2_and_20_connectors_with_commands(staff, make_connector):
    def fill(n, start):
        now = timezone.now()
        for i in range(start, start + n):
            connector = make_connector(f"c{i}", url="https://example.com/")
            command = make_failed(connector)
            Attempt.objects.create(command=command, number=1, started_at=now, finished_at=now, ok=False)

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(LIST).status_code == 200
        return len(captured)

    fill(2, 0)
    few = queries()
    fill(18, 2)
    assert queries() == few
