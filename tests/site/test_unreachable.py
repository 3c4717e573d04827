"""``ankusa_site.core.answers.unreachable``: which errors mean "a service did not answer" (a 503 with
Retry-After) and which are something else (left to the site's 500), from real failures."""

from __future__ import annotations

import psycopg
import pytest
import redis
from django.db import IntegrityError, connection
from django.db.utils import load_backend

from ankusa_site.core.answers import unavailable_detail, unreachable
from limits.models import Tenant
from tests.servers import free_port


@pytest.mark.django_db
def test_a_database_that_refuses_connections_is_unreachable():
    settings = {
        **connection.settings_dict,
        **{"ENGINE": "django.db.backends.postgresql", "NAME": "x", "USER": "postgres", "OPTIONS": {}},
        **{"HOST": "127.0.0.1", "PORT": str(free_port())},
    }
    wrapper = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, "unreachable")
    with pytest.raises(Exception) as raised:
        wrapper.ensure_connection()
    assert unreachable(raised.value) == "database"


def test_psycopgs_own_connection_failure_is_unreachable():
    with pytest.raises(psycopg.Error) as raised:
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/x", connect_timeout=2)
    assert unreachable(raised.value) == "database"


@pytest.mark.django_db
def test_a_constraint_the_database_enforces_is_not_an_outage():
    Tenant.objects.create(slug="acme", name="Acme")
    with pytest.raises(IntegrityError) as raised:
        Tenant.objects.create(slug="acme", name="Again")
    assert unreachable(raised.value) is None


def test_a_redis_that_refuses_connections_is_unreachable_and_its_reply_errors_are_not(redis_client):
    with pytest.raises(redis.RedisError) as raised:
        redis.Redis(port=free_port(), socket_connect_timeout=1).ping()
    assert unreachable(raised.value) == "Redis"
    with pytest.raises(redis.RedisError) as refused:
        redis_client.execute_command("NO-SUCH-COMMAND")
    assert unreachable(refused.value) is None


def test_the_answer_to_a_request_that_may_have_written_says_its_outcome_is_not_known():
    assert (
        unavailable_detail("database", "GET")
        == "The database did not answer; retry after the time in Retry-After."
    )
    assert unavailable_detail("database", "POST") == (
        "The database did not answer; retry after the time in Retry-After. "
        "Whether this request changed anything is not known: check before repeating it."
    )
    assert unavailable_detail("database", "POST", wrote=False) == (
        "The database did not answer; nothing was stored. Retry after the time in Retry-After."
    )


def test_every_api_503_tells_when_to_retry(db, settings):
    from rest_framework.test import APIClient

    from tests.staff import staff_user, token_for

    settings.CACHES = {
        **settings.CACHES,
        "redis": {**settings.CACHES["redis"], "LOCATION": "redis://127.0.0.1:1/0"},
    }
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_for(staff_user('viewer'))}")
    response = client.get("/api/v1/queues/jobs/?backend=redis")
    assert (response.status_code, response["Retry-After"], response.json()["error"]) == (
        503,
        "1",
        "backend_unavailable",
    )
