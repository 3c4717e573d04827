"""Server-side prepared statements for the few statements run once per command or per request.

``execute_prepared`` runs a statement on Django's own connection (so inside the caller's
transaction, if any) with a psycopg cursor of its own that binds on the server; a statement run
more than ``prepare_threshold`` times on a connection (``DATABASE_URL``'s option, 5 by default) is
prepared there for the connection's life, and ``off`` (None) never prepares. It keeps what
Django's cursor does: the connection health check and (re)connection, the thread-sharing check,
Django's exception classes (``IntegrityError`` …, via ``wrap_database_errors``), and an entry in
``connection.queries`` when queries are logged. Statements must be written with ``%s``
placeholders and passed their parameters as Python values (a ``datetime``, a list for an array),
never pre-adapted strings.
``ANKUSA_STOCK_DJANGO=prepared`` (``ankusa_site.core.stock``) runs the same statements through
Django's cursor instead: the reference the prepared way is held to.
"""

from __future__ import annotations

import time

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.pq import ExecStatus

from ankusa_site.core.stock import stock

TUPLES_OK = ExecStatus.TUPLES_OK


# Why: Django's PostgreSQL backend binds parameters on the client (psycopg's ClientCursor), so every
# statement reaches the server as new text, parsed and planned again. For the hot paths (intake's
# one-statement write, the dispatch loop's claim, start and finish) planning costs the server about
# as much as the work itself (bench/README.md). Django's own server_side_binding option would bind
# every ORM query on the server, most of which run too rarely to gain from it.
def execute_prepared(connection: BaseDatabaseWrapper, sql: str, params: list) -> tuple[list[tuple], int]:
    """Run ``sql`` prepared on the server (PostgreSQL only); returns its rows and its row count.

    The calling thread's own connection wrapper is looked up once (``django.db.connection`` is a
    proxy that looks it up on every attribute), and its psycopg cursor is kept with it for the
    connection's life: a new cursor costs more than the Python side of the statement itself.
    """
    db = connections[connection.alias]
    if stock("prepared"):  # ANKUSA_STOCK_DJANGO: Django's own cursor, bound on the client
        with db.cursor() as django_cursor:
            django_cursor.execute(sql, params)
            rows = django_cursor.fetchall() if django_cursor.description is not None else []
            return rows, django_cursor.rowcount
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    kept = db.__dict__.get("_ankusa_prepared")
    if kept is None or kept[0] is not db.connection:
        kept = db._ankusa_prepared = (db.connection, psycopg.Cursor(db.connection))
    cursor = kept[1]
    started = time.monotonic()
    with db.wrap_database_errors:
        cursor.execute(sql, params)  # prepared from its run after prepare_threshold
        # Whether it returned rows, without cursor.description (which builds a column list).
        returned = cursor.pgresult is not None and cursor.pgresult.status == TUPLES_OK
        rows = cursor.fetchall() if returned else []
    if db.queries_logged:
        db.queries_log.append(
            {
                "sql": f"{sql} -- prepared, params {params!r}"[:10_000],
                "time": f"{time.monotonic() - started:.3f}",
            }
        )
    return rows, cursor.rowcount
