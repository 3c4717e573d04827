import json
import re
import subprocess
import sys
from wsgiref.util import setup_testing_defaults

import pytest
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.db import connection
from django.test import Client, override_settings


def test_healthz_is_200_when_the_database_answers(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["failing"] == []
    assert body["checks"]["database"]["ok"] is True


def test_healthz_checks_redis_when_configured(client, db, redis_client):
    with override_settings(REDIS_CONFIGURED=True):
        response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["checks"]["redis"]["ok"] is True


def test_healthz_leaves_redis_out_when_no_feature_uses_it(client, db):
    with override_settings(
        REDIS_CONFIGURED=False, ANKUSA_STORE_SCOPE="node", ANKUSA_QUEUE_BACKEND="database"
    ):
        response = client.get("/healthz")
    assert "redis" not in response.json()["checks"]


def test_healthz_is_503_naming_redis_when_redis_is_down(client, db):
    # Port 1 on loopback: nothing listens, the connection is refused — a real outage, not a mock.
    with override_settings(REDIS_CONFIGURED=True, REDIS_URL="redis://127.0.0.1:1/0"):
        response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "fail"
    assert body["failing"] == ["redis"]
    assert body["checks"]["database"]["ok"] is True


def test_healthz_counts_a_fleet_store_as_using_redis(client, db):
    with override_settings(
        REDIS_CONFIGURED=False, ANKUSA_STORE_SCOPE="fleet", REDIS_URL="redis://127.0.0.1:1/0"
    ):
        response = client.get("/healthz")
    assert response.json()["failing"] == ["redis"]


def test_healthz_refuses_post(client, db):
    assert client.post("/healthz").status_code == 405


PROBE = """
import json, django
django.setup()
from django.test import Client
r = Client(HTTP_HOST="localhost").get("/healthz")
print(json.dumps({"status": r.status_code, "body": r.json()}))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "database_url",
    ["postgres://postgres@127.0.0.1:1/nothing", "sqlite:////dev/null/ankusa.sqlite3"],
    ids=["postgres-refused", "sqlite-unopenable"],
)
def test_healthz_is_503_naming_the_database_when_it_is_down(database_url, service_env):
    env = {**service_env, "DATABASE_URL": database_url, "REDIS_URL": "redis://127.0.0.1:1/0"}
    env.pop("REDIS_CONFIGURED", None)
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["status"] == 503
    assert "database" in answer["body"]["failing"]


def test_readyz_is_200_when_the_database_answers_and_migrations_are_applied(client, db):
    response = client.get("/readyz")
    assert response.status_code == 200
    assert response.json()["failing"] == []


@pytest.mark.slow
def test_readyz_is_503_naming_the_unapplied_migrations(service_env, tmp_path):
    # A fresh SQLite file that nobody migrated: the database answers, the schema is not there.
    env = {**service_env, "DATABASE_URL": f"sqlite:///{tmp_path}/empty.sqlite3"}
    probe = PROBE.replace("/healthz", "/readyz")
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["status"] == 503
    assert answer["body"]["failing"] == ["migrations"]
    assert re.match(r"^\d+ unapplied: \w+\.0001_initial", answer["body"]["checks"]["migrations"]["error"])


def test_a_node_keeps_its_database_connection_from_one_request_to_the_next(transactional_db):
    """Through the WSGI handler, which closes what is past ``CONN_MAX_AGE`` as each request ends (the
    test client never does). A SQLite connection closed after each request checkpointed the
    write-ahead log on every close."""
    handler = WSGIHandler()

    def readyz():
        environ = {"PATH_INFO": "/readyz"}
        setup_testing_defaults(environ)
        response = handler(environ, lambda status, headers, exc_info=None: None)
        response.close()
        return response.status_code

    assert readyz() == 200
    kept = connection.connection
    assert kept is not None
    assert readyz() == 200
    assert connection.connection is kept


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
@pytest.mark.parametrize("method", ["post", "put", "delete", "options"])
def test_a_probe_endpoint_answers_another_method_with_a_json_405_even_with_csrf_checks(db, path, method):
    response = getattr(Client(enforce_csrf_checks=True), method)(path)
    assert (response.status_code, response["Allow"]) == (405, "GET, HEAD")
    assert response.json()["error"] == "method_not_allowed"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/healthz/", "/readyz/", "/metrics/"])
def test_a_probe_endpoint_answers_head_and_a_trailing_slash(client, db, path):
    assert client.head(path).status_code == 200
    assert client.get(path).status_code == 200
