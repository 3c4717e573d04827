"""The dispatch loop's hot statements find their rows by primary key whatever the statistics say:
gathered on empty tables (a fresh install, autovacuum behind), a partial index's estimate of one
row would otherwise win, and each statement would walk every busy item or in-flight command."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from commands.dispatch.statements import START_SQL_POSTGRESQL, finish_statement
from commands.models import Command
from commands.states import State
from queues.backends import database
from queues.models import QueueItem

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner"),
]

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)
# Busy items and in-flight commands, against a statement's batch of BATCH ids (the default).
ROWS = 20_000
BATCH = 100


def scans(sql: str, params: list) -> set[str]:
    """The index (or ``seq:<table>``) each scan of the statement's plan reads."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        [[plan]] = cursor.fetchone()
    found: set[str] = set()

    def walk(node: dict) -> None:
        if "Index Name" in node:
            found.add(node["Index Name"])
        elif node["Node Type"] == "Seq Scan":
            found.add(f"seq:{node['Relation Name']}")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    return found


@pytest.fixture
def stale_statistics(make_connector, make_command):
    """Statistics gathered on empty tables, then thousands of busy items and in-flight commands."""
    connector = make_connector(kind="log")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {QueueItem._meta.db_table}")
        cursor.execute(f"ANALYZE {Command._meta.db_table}")
    make_command(connector, state=State.QUEUED)
    columns = ", ".join(
        connection.ops.quote_name(f.column) for f in Command._meta.concrete_fields if not f.primary_key
    )
    with connection.cursor() as cursor:
        # Copies of that one, half of them dispatching.
        cursor.execute(
            f"INSERT INTO {Command._meta.db_table} ({columns}) SELECT {columns} FROM {Command._meta.db_table}"
            ", generate_series(2, %s)",
            [ROWS],
        )
        cursor.execute(
            f"UPDATE {Command._meta.db_table} SET state = %s WHERE id %% 2 = 0", [State.DISPATCHING]
        )
        cursor.execute(
            f"INSERT INTO {QueueItem._meta.db_table} (queue, state, position, payload, enqueued_at,"
            " claimed_at, claims, requeue_count, fail_count, last_error)"
            " SELECT 'commands', 'busy', g, '{}', now(), now(), 1, 0, 0, '' FROM generate_series(1, %s) g",
            [ROWS],
        )
    return list(QueueItem.objects.values_list("id", flat=True)[:BATCH])


def test_done_finds_its_items_by_primary_key_with_empty_table_statistics(stale_statistics):
    ids = stale_statistics
    assert scans(database.DONE_SQL_POSTGRESQL, ["commands", ids, [1] * len(ids)]) == {"queues_queueitem_pkey"}
    assert scans(database.DONE_ANY_CLAIM_SQL_POSTGRESQL, ["commands", ids]) == {"queues_queueitem_pkey"}


def test_start_and_finish_find_their_commands_by_primary_key_with_empty_table_statistics(stale_statistics):
    ids = list(Command.objects.values_list("id", flat=True)[:BATCH])
    start = [State.DISPATCHING.value, T0, State.QUEUED.value, ids, [1] * len(ids)]
    assert scans(START_SQL_POSTGRESQL, start) == {"commands_command_pkey"}
    sql, params = finish_statement(ids, 1, "succeed", T0, {"last_error": ""}, connection)
    assert scans(sql, params) == {"commands_command_pkey"}
