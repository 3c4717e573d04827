"""The PostgreSQL layer under the hot paths: prepared statements and the round-trip-free health check."""

from __future__ import annotations

import select

import psycopg
import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.backends.postgresql.base import DatabaseWrapper as DjangoWrapper
from django.test.utils import CaptureQueriesContext

from ankusa_site.core.prepared import execute_prepared
from limits.models import Tenant

pytestmark = pytest.mark.django_db(transaction=True)

INSERT_TENANT = (
    "INSERT INTO limits_tenant (slug, name, active, created_at) VALUES (%s, %s, true, now()) RETURNING id"
)


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_a_prepared_statement_stays_prepared_on_its_connection_and_returns_rows(postgres):
    connection.ensure_connection()
    for _ in range(connection.connection.prepare_threshold + 1):  # prepared once run that many times
        rows, count = execute_prepared(connection, "SELECT %s::int + 1 AS n", [41])
    assert (rows, count) == ([(42,)], 1)
    assert any("$1::int + 1" in statement for statement in prepared_statements())
    assert execute_prepared(connection, "SELECT %s::int + 1 AS n", [1])[0] == [(2,)]


def test_a_statement_is_prepared_once_it_has_run_prepare_threshold_times_not_before(postgres):
    connection.ensure_connection()
    saved, connection.connection.prepare_threshold = connection.connection.prepare_threshold, 3
    try:
        for _ in range(3):  # run as often as the threshold says: still planned each time
            assert execute_prepared(connection, "SELECT %s::int - 7", [10])[0] == [(3,)]
            assert not any("- 7" in statement for statement in prepared_statements())
        assert execute_prepared(connection, "SELECT %s::int - 7", [10])[0] == [(3,)]
        assert any("$1::int - 7" in statement for statement in prepared_statements())
    finally:
        connection.connection.prepare_threshold = saved


def test_a_prepared_statement_raises_djangos_integrity_error(postgres):
    execute_prepared(connection, INSERT_TENANT, ["twice", "Twice"])
    with pytest.raises(IntegrityError):
        execute_prepared(connection, INSERT_TENANT, ["twice", "Twice again"])
    assert Tenant.objects.filter(slug="twice").count() == 1


def test_a_prepared_statement_joins_the_callers_transaction(postgres):
    with pytest.raises(RuntimeError), transaction.atomic():
        execute_prepared(connection, INSERT_TENANT, ["undone", "Undone"])
        raise RuntimeError("roll back")
    assert not Tenant.objects.filter(slug="undone").exists()


def test_a_prepared_statement_is_listed_among_the_captured_queries(postgres):
    with CaptureQueriesContext(connection) as captured:
        execute_prepared(connection, "SELECT %s::text", ["seen"])
    assert len(captured) == 1
    assert "prepared" in captured[0]["sql"]


def test_with_prepare_threshold_off_the_statement_runs_unprepared(postgres):
    connection.ensure_connection()
    saved = connection.connection.prepare_threshold
    connection.connection.prepare_threshold = None  # what ?prepare_threshold=off gives a connection
    try:
        assert execute_prepared(connection, "SELECT %s::int * 3", [5])[0] == [(15,)]
        assert not any("* 3" in statement for statement in prepared_statements())
    finally:
        connection.connection.prepare_threshold = saved


@pytest.fixture
def own_connection(postgres):
    """A second connection to the test database, closed at the end."""
    wrapper = connections.create_connection("default")
    wrapper.ensure_connection()
    yield wrapper
    wrapper.close()


def backend_pid(wrapper) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def test_an_idle_healthy_connection_passes_the_health_check_without_a_round_trip(own_connection, monkeypatch):
    asked = []
    monkeypatch.setattr(DjangoWrapper, "is_usable", lambda self: asked.append(self) or True)
    backend_pid(own_connection)
    assert own_connection.is_usable()
    assert asked == []


def test_a_connection_the_server_ended_fails_the_health_check_and_the_next_query_reconnects(own_connection):
    first = backend_pid(own_connection)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [first])
    # The server's goodbye (an error and the socket's close) makes the idle socket readable.
    assert select.select([own_connection.connection.fileno()], [], [], 10)[0]
    assert not own_connection.is_usable()

    own_connection.health_check_done = False  # as at the start of a request
    own_connection.close_if_health_check_failed()
    assert backend_pid(own_connection) != first


def test_a_connection_inside_a_transaction_is_checked_the_old_way(own_connection, monkeypatch):
    asked = []
    monkeypatch.setattr(DjangoWrapper, "is_usable", lambda self: asked.append(self) or True)
    own_connection.connection.execute("BEGIN")
    assert own_connection.connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert own_connection.is_usable()
    assert asked == [own_connection]
    own_connection.connection.execute("ROLLBACK")
