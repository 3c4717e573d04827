"""REST: lengths and ages per queue, requeue-failed, remove-failed; staff only; JSON errors."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from queues.backends.database import DatabaseFIFO
from queues.backends.redis import RedisFIFO
from tests.staff import api_client, staff_user


@pytest.fixture
def api(db):
    return api_client(staff_user("admin", "ops"))


@pytest.fixture
def failed_jobs(db):
    """Queue ``jobs`` (database) with one waiting item and three failed ones (fail counts 1, 1, 2)."""
    queue = DatabaseFIFO("jobs")
    queue.enqueue("a", "b", "c")
    for item in queue.claim(3):
        queue.fail(item, "boom")
    queue.requeue_failed(limit=1)
    queue.fail(*queue.claim(), "boom again")
    queue.enqueue("waiting")
    return queue


def test_the_list_shows_every_queue_with_lengths_and_ages(api, failed_jobs, django_redis, settings):
    settings.ANKUSA_QUEUE_BACKENDS = {"mail": "redis"}
    RedisFIFO("mail").enqueue("m")
    response = api.get("/api/v1/queues/")
    assert response.status_code == 200
    rows = {(row["name"], row["backend"]): row for row in response.json()["queues"]}
    assert sorted(rows) == [("jobs", "database"), ("mail", "redis")]
    assert [rows[("jobs", "database")][kind]["length"] for kind in ("main", "busy", "failed")] == [1, 0, 3]
    assert rows[("mail", "redis")]["main"]["length"] == 1
    assert rows[("mail", "redis")]["main"]["age_s"] >= 0


def test_one_queue_on_its_configured_backend_or_the_one_asked_for(api, failed_jobs, django_redis):
    assert api.get("/api/v1/queues/jobs/").json()["failed"]["length"] == 3
    assert api.get("/api/v1/queues/jobs/?backend=redis").json()["failed"]["length"] == 0


def test_requeue_failed_with_a_fail_count_filter(api, failed_jobs):
    response = api.post("/api/v1/queues/jobs/requeue-failed/", {"max_fail_count": 1}, format="json")
    assert response.status_code == 200
    assert response.json() == {"queue": "jobs", "backend": "database", "requeued": 2}
    assert failed_jobs.length("failed") == 1


def test_requeue_failed_with_a_delay(api, failed_jobs):
    assert (
        api.post("/api/v1/queues/jobs/requeue-failed/", {"delay_s": 60}, format="json").json()["requeued"]
        == 0
    )
    with time_machine.travel(timezone.now() + timedelta(minutes=2)):
        response = api.post("/api/v1/queues/jobs/requeue-failed/", {"delay_s": 60}, format="json")
    assert response.json()["requeued"] == 3


def test_remove_failed_all_or_older_than(api, failed_jobs):
    assert (
        api.post("/api/v1/queues/jobs/remove-failed/", {"older_than_s": 3600}, format="json").json()[
            "removed"
        ]
        == 0
    )
    assert api.post("/api/v1/queues/jobs/remove-failed/").json() == {
        "queue": "jobs",
        "backend": "database",
        "removed": 3,
    }
    assert failed_jobs.length("main") == 1


@pytest.mark.parametrize(
    "body, detail",
    [
        ({"max_fail_count": -1}, "max_fail_count: Ensure this value is greater than or equal to 0."),
        ({"max_fail_count": "many"}, "max_fail_count: A valid integer is required."),
        ({"delay_s": 1e300}, "delay_s: Ensure this value is less than or equal to 864000000."),
        ({"delay": 5}, "delay: Unknown field."),
        ([1, 2], "body: Send a JSON object."),
    ],
)
def test_bad_input_is_a_400_with_a_json_error(api, failed_jobs, body, detail):
    response = api.post("/api/v1/queues/jobs/requeue-failed/", body, format="json")
    assert response.status_code == 400
    body = response.json()
    assert {"error": body["error"], "detail": body["detail"]} == {"error": "invalid", "detail": detail}
    assert failed_jobs.length("failed") == 3


def test_malformed_json_is_a_400(api, db):
    response = api.post("/api/v1/queues/jobs/remove-failed/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "parse_error"


def test_nan_is_refused(api, db):
    response = api.post(
        "/api/v1/queues/jobs/remove-failed/", '{"older_than_s": NaN}', content_type="application/json"
    )
    assert response.status_code == 400


def test_an_oversized_body_is_a_400(api, db):
    body = '{"older_than_s": 1' + " " * 5000 + "}"
    response = api.post("/api/v1/queues/jobs/remove-failed/", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {
        "error": "invalid",
        "detail": "body: At most 4096 bytes.",
        "fields": {"body": ["At most 4096 bytes."]},
    }


def test_a_bad_queue_name_or_backend_is_a_400(api, db):
    assert api.get("/api/v1/queues/a%7Bb%7D/").json() == {
        "error": "invalid",
        "detail": "name: Use 1 to 64 letters, digits, '_', '.' or '-'.",
        "fields": {"name": ["Use 1 to 64 letters, digits, '_', '.' or '-'."]},
    }
    assert api.get("/api/v1/queues/jobs/?backend=kafka").status_code == 400


def test_a_backend_that_does_not_answer_is_a_503(api, db, settings):
    settings.CACHES = {
        **settings.CACHES,
        "redis": {**settings.CACHES["redis"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    response = api.get("/api/v1/queues/jobs/?backend=redis")
    assert response.status_code == 503
    assert response.json() == {
        "error": "backend_unavailable",
        "detail": "The queue backend did not answer: ConnectionError.",
    }


def test_anonymous_callers_get_a_json_401(db):
    response = APIClient().get("/api/v1/queues/")
    assert response.status_code == 401
    assert response.json()["error"] == "not_authenticated"


def test_non_staff_users_get_a_json_403(db):
    user = get_user_model().objects.create_user("tenant", password="x")
    client = APIClient()
    client.force_authenticate(user)
    response = client.post("/api/v1/queues/jobs/remove-failed/")
    assert response.status_code == 403
    assert response.json()["error"] == "permission_denied"


def test_the_wrong_method_is_a_json_405(api, db):
    response = api.delete("/api/v1/queues/jobs/")
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"
