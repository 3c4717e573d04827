"""The admin: database items by sub-queue with requeue/drop after a count, and the overview."""

from __future__ import annotations

import pytest
from django.contrib.admin import helpers
from django.urls import reverse

from queues.backends.database import DatabaseFIFO
from queues.backends.redis import RedisFIFO
from queues.models import QueueItem

CHANGELIST = "admin:queues_queueitem_changelist"


@pytest.fixture
def staff(admin_client):
    return admin_client


@pytest.fixture
def jobs(db):
    """A queue with 2 waiting, 1 busy and 2 failed items."""
    queue = DatabaseFIFO("jobs", requeue_limit=0)
    queue.enqueue(*[{"n": n} for n in range(5)])
    failed = queue.claim(2)
    queue.requeue(*failed, error="connector down")
    queue.claim()
    return queue


def states():
    return sorted(QueueItem.objects.values_list("payload__n", "state"))


def test_the_list_shows_payload_age_attempts_and_error(staff, jobs):
    response = staff.get(reverse(CHANGELIST), {"state": "failed"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "{&quot;n&quot;: 0}" in page
    assert "connector down" in page
    assert page.count('class="action-select"') == 2


def test_the_list_costs_the_same_queries_for_many_items(staff, jobs, django_assert_max_num_queries):
    DatabaseFIFO("jobs").enqueue(*range(200))
    with django_assert_max_num_queries(8):
        assert staff.get(reverse(CHANGELIST)).status_code == 200


def test_requeue_shows_the_count_before_doing_anything(staff, jobs):
    ids = list(QueueItem.objects.values_list("id", flat=True))
    response = staff.post(
        reverse(CHANGELIST), {"action": "requeue_selected", helpers.ACTION_CHECKBOX_NAME: ids}
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert "Requeue <strong>5</strong> item(s)" in page
    assert "<li>waiting: 2</li>" in page and "<li>claimed: 1</li>" in page and "<li>failed: 2</li>" in page
    assert states() == [(0, "failed"), (1, "failed"), (2, "busy"), (3, "main"), (4, "main")]


def test_confirmed_requeue_moves_busy_and_failed_items_to_the_tail(staff, jobs):
    ids = list(QueueItem.objects.values_list("id", flat=True))
    response = staff.post(
        reverse(CHANGELIST),
        {"action": "requeue_selected", helpers.ACTION_CHECKBOX_NAME: ids, "confirmed": "yes"},
        follow=True,
    )
    assert "3 item(s): requeue done." in response.content.decode()
    assert [item.payload["n"] for item in jobs.claim(5)] == [3, 4, 0, 1, 2]


def test_drop_everything_matching_the_filter_after_the_count(staff, jobs):
    url = reverse(CHANGELIST) + "?state__exact=failed"
    one = QueueItem.objects.filter(state="failed").values_list("id", flat=True)[0]
    form = {"action": "drop_selected", helpers.ACTION_CHECKBOX_NAME: [one], "select_across": "1"}
    response = staff.post(url, form)
    assert "Drop <strong>2</strong> item(s), everything that matches the filter" in response.content.decode()
    staff.post(url, {**form, "confirmed": "yes"})
    assert states() == [(2, "busy"), (3, "main"), (4, "main")]


def test_items_cannot_be_added_by_hand(staff, db):
    assert staff.get(reverse("admin:queues_queueitem_add")).status_code == 403


def test_the_overview_shows_every_queue_of_both_backends(staff, jobs, django_redis, settings):
    settings.ANKUSA_QUEUE_BACKENDS = {"mail": "redis"}
    RedisFIFO("mail").enqueue("m1", "m2")
    page = staff.get(reverse("admin:queues_overview")).content.decode()
    assert '<a href="/admin/queues/queueitem/?queue=jobs">jobs</a></td>\n      <td>database</td>' in page
    assert '<a href="/admin/queues/queueitem/redis/mail/">mail</a></td>\n      <td>redis</td>' in page
    assert '<a href="/admin/queues/queueitem/redis/mail/?kind=main">2</a>' in page


def test_the_overview_shows_a_redis_outage_as_a_line_not_an_error_page(staff, jobs, settings):
    settings.ANKUSA_QUEUE_BACKENDS = {"mail": "redis"}
    settings.CACHES = {
        **settings.CACHES,
        "redis": {**settings.CACHES["redis"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    response = staff.get(reverse("admin:queues_overview"))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Redis: ConnectionError" in page
    assert ">jobs</a>" in page


def test_the_overview_needs_staff(client, db):
    response = client.get(reverse("admin:queues_overview"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_search_by_id_and_a_non_number_finds_nothing(staff, jobs):
    pk = QueueItem.objects.order_by("id").values_list("id", flat=True)[0]
    assert staff.get(reverse(CHANGELIST), {"q": str(pk)}).content.decode().count('class="action-select"') == 1
    response = staff.get(reverse(CHANGELIST), {"q": "abc"})
    assert response.status_code == 200
    assert response.content.decode().count('class="action-select"') == 0
