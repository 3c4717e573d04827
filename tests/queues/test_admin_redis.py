"""The admin page of a Redis queue: items by sub-queue, requeue / drop after a count, permissions."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse

from queues.backends.redis import RedisFIFO
from tests.staff import staff_user


def page(name: str = "mail", kind: str | None = None) -> str:
    url = reverse("admin:queues_redis_items", args=[name])
    return url if kind is None else f"{url}?kind={kind}"


@pytest.fixture
def staff(admin_client):
    return admin_client


@pytest.fixture
def viewer(client, db):
    client.force_login(staff_user("viewer"))
    return client


@pytest.fixture
def mail(django_redis):
    """Redis queue ``mail`` with 2 waiting (m3, m4), 1 busy (m2) and 2 failed (m0, m1) items."""
    queue = RedisFIFO("mail", requeue_limit=0)
    queue.enqueue(*[{"m": n} for n in range(5)])
    queue.requeue(*queue.claim(2), error="smtp <down>")
    queue.claim()
    return queue


def payloads(queue: RedisFIFO, kind: str) -> list[int]:
    return [item.payload["m"] for item in queue.peek(kind, 100)]


def everything(queue: RedisFIFO) -> tuple[list[int], list[int], list[int]]:
    return payloads(queue, "main"), payloads(queue, "busy"), payloads(queue, "failed")


@pytest.mark.parametrize(
    ("kind", "listed"), [("main", [3, 4]), ("busy", [2]), ("failed", [0, 1]), (None, [3, 4])]
)
def test_the_page_lists_the_items_of_each_sub_queue(staff, mail, kind, listed):
    response = staff.get(page(kind=kind))
    assert response.status_code == 200
    html = response.content.decode()
    assert html.count('class="item-select"') == len(listed)
    assert f'<strong id="sub-queue-length">{len(listed)}</strong>' in html
    for n in listed:
        assert f"{{&quot;m&quot;: {n}}}" in html


def test_the_page_shows_attempts_and_the_escaped_error_of_failed_items(staff, mail):
    html = staff.get(page(kind="failed")).content.decode()
    assert "smtp &lt;down&gt;" in html and "smtp <down>" not in html
    (first, second) = mail.peek("failed", 2)
    assert f'value="{first.id}"' in html and f'value="{second.id}"' in html
    assert "<td>1</td><td>0</td><td>1</td>" in html  # claims, requeues, fails


def test_a_payload_is_escaped_and_a_long_one_cut(staff, django_redis):
    RedisFIFO("mail").enqueue({"body": "<b>" + "x" * 500})
    html = staff.get(page()).content.decode()
    assert "&lt;b&gt;" + "x" * 60 in html and "x" * 100 not in html and "<b>x" not in html


def test_requeue_shows_the_count_before_doing_anything(staff, mail):
    ids = [item.id for item in mail.peek("failed", 2)]
    response = staff.post(page(kind="failed"), {"operation": "requeue_selected", "ids": ids})
    assert response.status_code == 200
    assert "Requeue <strong>2</strong> item(s) of failed: the ticked ones" in response.content.decode()
    assert everything(mail) == ([3, 4], [2], [0, 1])


def test_every_item_shows_the_length_of_the_sub_queue_before_doing_anything(staff, mail):
    response = staff.post(page(kind="main"), {"operation": "drop_all"})
    assert (
        "Drop <strong>2</strong> item(s) of main: every item of this sub-queue" in response.content.decode()
    )
    assert everything(mail) == ([3, 4], [2], [0, 1])


def test_confirmed_requeue_of_ticked_items_moves_them_to_the_tail(staff, mail):
    (busy,) = mail.peek("busy", 1)
    failed = mail.peek("failed", 1)[0]
    form = {"operation": "requeue_selected", "ids": [busy.id, failed.id], "confirmed": "yes"}
    response = staff.post(page(kind="busy"), form, follow=True)
    assert "2 item(s): requeue done." in response.content.decode()
    assert response.redirect_chain == [(page(kind="busy"), 302)]
    assert everything(mail) == ([3, 4, 0, 2], [], [1])
    assert mail.done(busy) == 0  # its worker lost it


def test_confirmed_drop_of_ticked_items_deletes_them(staff, mail):
    ids = [item.id for item in mail.peek("main", 1) + mail.peek("failed", 1)]
    response = staff.post(page(), {"operation": "drop_selected", "ids": ids, "confirmed": "yes"}, follow=True)
    assert "2 item(s): drop done." in response.content.decode()
    assert everything(mail) == ([4], [2], [1])


@pytest.mark.parametrize(
    ("operation", "kind", "message", "after"),
    [
        ("requeue_all", "failed", "2 item(s): requeue done.", ([3, 4, 0, 1], [2], [])),
        ("requeue_all", "busy", "1 item(s): requeue done.", ([3, 4, 2], [], [0, 1])),
        ("drop_all", "failed", "2 item(s): drop done.", ([3, 4], [2], [])),
        ("drop_all", "busy", "1 item(s): drop done.", ([3, 4], [], [0, 1])),
        ("drop_all", "main", "2 item(s): drop done.", ([], [2], [0, 1])),
    ],
)
def test_confirmed_operation_on_every_item_of_a_sub_queue(staff, mail, operation, kind, message, after):
    response = staff.post(page(kind=kind), {"operation": operation, "confirmed": "yes"}, follow=True)
    assert message in response.content.decode()
    assert everything(mail) == after


def test_requeue_of_main_is_refused_with_a_message(staff, mail):
    ids = [item.id for item in mail.peek("main", 2)]
    form = {"operation": "requeue_all", "ids": ids, "confirmed": "yes"}
    response = staff.post(page(kind="main"), form, follow=True)
    assert "Items in main are waiting already" in response.content.decode()
    assert everything(mail) == ([3, 4], [2], [0, 1])


def test_get_never_changes_anything(staff, mail):
    ids = [item.id for item in mail.peek("failed", 2)]
    query = {"operation": "drop_selected", "ids": ids, "confirmed": "yes"}
    assert staff.get(page(kind="failed"), query).status_code == 200
    assert everything(mail) == ([3, 4], [2], [0, 1])


def test_a_viewer_sees_the_page_without_buttons(viewer, mail):
    html = viewer.get(page(kind="failed")).content.decode()
    assert "smtp &lt;down&gt;" in html
    assert 'name="operation"' not in html and 'class="item-select"' not in html


@pytest.mark.parametrize("operation", ["requeue_selected", "drop_selected", "requeue_all", "drop_all"])
@pytest.mark.parametrize("confirmed", ["", "yes"])
def test_a_viewer_cannot_requeue_or_drop(viewer, mail, operation, confirmed):
    ids = [item.id for item in mail.peek("failed", 2)]
    form = {"operation": operation, "ids": ids, "confirmed": confirmed}
    assert viewer.post(page(kind="failed"), form).status_code == 403
    assert everything(mail) == ([3, 4], [2], [0, 1])


def test_an_operator_who_may_change_but_not_delete_can_requeue_and_not_drop(client, db, mail):
    user = User.objects.create_user("ops", "ops@example.com", "pw", is_staff=True)
    user.user_permissions.add(*Group.objects.get(name="viewer").permissions.all())
    user.user_permissions.add(
        *Group.objects.get(name="admin").permissions.filter(codename="change_queueitem")
    )
    client.force_login(user)
    html = client.get(page(kind="failed")).content.decode()
    assert 'value="requeue_all"' in html and 'value="drop_all"' not in html
    assert client.post(page(kind="failed"), {"operation": "drop_all", "confirmed": "yes"}).status_code == 403
    client.post(page(kind="failed"), {"operation": "requeue_all", "confirmed": "yes"})
    assert everything(mail) == ([3, 4, 0, 1], [2], [])


def test_the_page_needs_staff(client, mail):
    response = client.get(page())
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_the_overview_links_each_redis_queue_to_its_page(staff, mail, settings):
    settings.ANKUSA_QUEUE_BACKENDS = {"mail": "redis"}
    html = staff.get(reverse("admin:queues_overview")).content.decode()
    assert f'<a href="{page()}">mail</a></td>\n      <td>redis</td>' in html
    for kind, length in (("main", 2), ("busy", 1), ("failed", 2)):
        assert f'<a href="{page(kind=kind)}">{length}</a>' in html


def test_a_dead_redis_is_a_message_on_the_page(staff, db, settings):
    settings.ANKUSA_QUEUE_BACKENDS = {"mail": "redis"}
    settings.CACHES = {
        **settings.CACHES,
        "redis": {**settings.CACHES["redis"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    response = staff.get(page(kind="busy"))
    assert response.status_code == 200
    assert '<p class="errornote">Redis: ConnectionError' in response.content.decode()
    response = staff.post(page(kind="busy"), {"operation": "drop_all", "confirmed": "yes"})
    assert response.status_code == 200
    assert '<p class="errornote">Redis: ConnectionError' in response.content.decode()


@pytest.mark.parametrize(
    ("url", "form", "status"),
    [
        (page(kind="waiting"), None, 400),
        (page(name="no-such-queue"), None, 404),
        (page(name="bad{name}"), None, 404),
        (page(kind="failed"), {"operation": "drop_selected", "ids": ["1", "x"]}, 400),
        (page(kind="failed"), {"operation": "explode"}, 400),
    ],
)
def test_bad_input_is_a_client_error(staff, mail, url, form, status):
    response = staff.get(url) if form is None else staff.post(url, form)
    assert response.status_code == status
    assert everything(mail) == ([3, 4], [2], [0, 1])


def test_drop_with_nothing_ticked_asks_for_a_selection(staff, mail):
    response = staff.post(page(kind="failed"), {"operation": "drop_selected"}, follow=True)
    assert "Tick the items first." in response.content.decode()
    assert everything(mail) == ([3, 4], [2], [0, 1])
