"""The dashboard at the admin index: counts linked to their lists, queues, and a server-drawn SVG chart."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from commands.models import Attempt, Command
from commands.staff.dashboard import attempt_hours, outcome_chart
from commands.states import State
from tests.commands.staff import login_as, make_failed

INDEX = reverse("admin:index")


@pytest.fixture
def staff(client, db):
    login_as(client, None)
    return client


def attempt(command, number, finished_at, **fields):
    return Attempt.objects.create(
        command=command, number=number, started_at=finished_at, finished_at=finished_at, **fields
    )


def test_the_index_shows_counts_by_state_and_reason_each_linked_to_its_list(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    make_failed(connector, outlook="after-fix", reason="backing-off")
    make_failed(connector, outlook="after-fix", reason="")
    make_failed(connector, outlook="", reason="outlook-unknown")
    Command.objects.create(tenant=connector.tenant, connector=connector, state=State.DRAFT)
    response = staff.get(INDEX)
    assert response.status_code == 200
    html = response.content.decode()
    assert '?state__exact=failed">failed</a></td><td>3</td>' in html
    assert '?state__exact=draft">draft</a></td><td>1</td>' in html
    assert re.search(
        r'\?reason=after-fix"><span class="ankusa-badge ankusa-tone-fix">after fix</span></a></td><td>2<',
        html,
    )
    assert '?reason=outlook-unknown"' in html
    assert 'id="content-main"' in html  # the app list is still there, below


def test_the_chart_is_inline_svg_with_no_script_and_no_outside_address(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")
    command = make_failed(connector)
    now = timezone.now()
    attempt(command, 1, now - timedelta(hours=2), ok=False, outlook="again")
    attempt(command, 2, now - timedelta(minutes=5), ok=True)
    attempt(command, 3, now - timedelta(minutes=4), ok=None)
    attempt(command, 4, now - timedelta(hours=30), ok=True)  # older than 24 hours: left out
    html = staff.get(INDEX).content.decode()
    svg = re.search(
        r'<svg xmlns="http://www.w3.org/2000/svg" id="ankusa-outcomes".*?</svg>', html, re.S
    ).group(0)
    assert svg.count('class="ankusa-bar ankusa-ok"') == 1
    assert svg.count('class="ankusa-bar ankusa-again"') == 1
    assert svg.count('class="ankusa-bar ankusa-unknown"') == 1
    assert "ok (1)" in svg and "failed: again (1)" in svg and "unknown (1)" in svg
    assert "Attempts in the last 24 hours (3)" in html
    # Offline: no script in the dashboard, and nothing in the page is fetched from another host.
    dashboard = re.search(r'<div id="ankusa-dashboard">.*?</svg>', html, re.S).group(0)
    assert "<script" not in dashboard
    assert not re.search(r'(src|href)="(https?:)?//', html)


def test_the_hours_are_the_last_24_with_outcomes_by_outlook(db, make_connector):
    command = make_failed(make_connector(url="http://127.0.0.1:9/"))
    now = timezone.now().replace(minute=30)
    attempt(command, 1, now - timedelta(hours=23), ok=False, outlook="never")
    attempt(command, 2, now - timedelta(hours=23), ok=False, outlook="after-fix")
    attempt(command, 3, now, ok=False, outlook="")
    hours = attempt_hours(now)
    assert len(hours) == 24
    assert hours[0][1]["never"] == hours[0][1]["after-fix"] == 1
    assert hours[-1][1]["unknown"] == 1
    assert sum(sum(c.values()) for _, c in hours) == 3


def test_the_chart_escapes_what_it_draws_and_draws_an_empty_day():
    svg = outcome_chart([(timezone.now(), {"ok": 0, "again": 0, "after-fix": 0, "never": 0, "unknown": 0})])
    assert svg.startswith("<svg") and "<rect class" not in svg and "ok (0)" in svg


def test_the_dashboard_costs_the_same_queries_for_few_and_many_commands(staff, make_connector):
    connector = make_connector(url="http://127.0.0.1:9/")

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert staff.get(INDEX).status_code == 200
        return len(captured)

    make_failed(connector)
    few = queries()
    for i in range(30):
        command = make_failed(
            connector, outlook=["again", "never", ""][i % 3], reason=["", "never", "outlook-unknown"][i % 3]
        )
        attempt(command, 1, timezone.now() - timedelta(hours=i % 24), ok=False, outlook="again")
    assert queries() == few


def test_a_redis_outage_is_a_line_on_the_dashboard_not_an_error_page(staff, settings):
    settings.ANKUSA_QUEUE_BACKENDS = {"mail": "redis"}
    settings.CACHES = {
        **settings.CACHES,
        "redis": {**settings.CACHES["redis"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    response = staff.get(INDEX)
    assert response.status_code == 200
    assert "ConnectionError" in response.content.decode()


def test_staff_without_the_command_view_permission_see_the_index_without_the_dashboard(client, db):
    from django.contrib.auth.models import User

    user = User.objects.create_user("plain", password="pw", is_staff=True)
    client.force_login(user)
    response = client.get(INDEX)
    assert response.status_code == 200
    assert 'id="ankusa-dashboard"' not in response.content.decode()


def test_a_viewer_sees_the_dashboard(client, db):
    login_as(client, "viewer")
    assert 'id="ankusa-dashboard"' in client.get(INDEX).content.decode()
