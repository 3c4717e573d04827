"""Benchmark: what PostgreSQL spends on the intake's statement, against the least durable write a
receiver can make (the durable floor of ``bench/intake.py``), and what each part of the schema adds.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python bench/intake_statement.py
        [--statements 3000] [--quick]

Why: ``intake_vs_bare_view`` is held down by the statement, mostly by PostgreSQL's own work on it
rather than the worker's wait (bench/README.md, *What the target needs*). This says which part of
that work the schema could give up, were it willing: the payload's trigram index, the foreign keys,
the queue's wake trigger, the check constraints, the indexes the lists and the dispatcher read.

How: on a throw-away database (``bench_statement_<pid>``, migrated and seeded as ``bench/intake.py``
does, with the node-local store), this process loads the site, sends one GitHub-signed webhook
through Django's test client and keeps the statement the intake sent and its parameters. Then one
connection of its own runs, outside a transaction and prepared, as the intake does, two blocks of
``--statements`` of each step: the floor's ``INSERT``; the intake's statement (a new event key each
time); the same after each removal, cumulative; last, with ``synchronous_commit`` off, the intake's
and the floor's (the commit's share, which intake never gives up). A figure is the backend
process's CPU per statement (its utime and stime in ``/proc``: PostgreSQL on this machine), the
lower of the two blocks. One statement at a time, so without the contention of the served
benchmark, whose figures are higher.

The last line is JSON: ``backend_us`` (each step's µs), ``statement_vs_floor`` (the intake's
statement ÷ the floor's insert), ``removable_share`` (what every removal together took off ÷ the
statement's cost) and ``commit_share`` (what turning off the synchronous commit took off ÷ the
statement's cost).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.intake import BODY, base_env, prepare, process_cpu, signature, throwaway_database  # noqa: E402

TABLES = ("commands_delivery", "commands_command", "queues_queueitem")
TABLE_LIST = ", ".join(f"'{table}'" for table in TABLES)
# Each removal: what it takes away, and the statements that find and drop it.
REMOVALS = [
    ("trigram index", "SELECT 'DROP INDEX commands_payload_trgm_idx'"),
    (
        "foreign keys",
        "SELECT format('ALTER TABLE %s DROP CONSTRAINT %I', conrelid::regclass, conname) FROM pg_constraint "
        f"WHERE contype = 'f' AND conrelid::regclass::text IN ({TABLE_LIST})",
    ),
    ("wake trigger", "SELECT 'DROP TRIGGER queues_queueitem_wake ON queues_queueitem'"),
    (
        "check constraints",
        "SELECT format('ALTER TABLE %s DROP CONSTRAINT %I', conrelid::regclass, conname) FROM pg_constraint "
        f"WHERE contype = 'c' AND conrelid::regclass::text IN ({TABLE_LIST})",
    ),
    (
        "other indexes",  # all but the keys and the unique ones (the dedupe and the API's keys)
        "SELECT format('DROP INDEX %s', indexrelid::regclass) FROM pg_index "
        f"WHERE indrelid::regclass::text IN ({TABLE_LIST}) AND NOT indisprimary AND NOT indisunique",
    ),
]


def captured_statement(tenant: str) -> tuple[str, list]:
    """The statement the intake sends for one signed webhook to ``tenant``, and its parameters."""
    import django

    django.setup()
    from django.test import Client

    from commands.intake import write

    captured = []
    execute = write.execute_prepared

    def keep(db, sql, params):
        captured.append((sql, list(params)))
        return execute(db, sql, params)

    write.execute_prepared = keep
    try:
        body = BODY.encode()
        answer = Client().post(
            f"/hooks/{tenant}/orders/",
            data=body,
            content_type="application/json",
            HTTP_HOST="127.0.0.1",
            HTTP_X_GITHUB_EVENT="push",
            HTTP_X_GITHUB_DELIVERY=secrets.token_hex(16),
            HTTP_X_HUB_SIGNATURE_256=signature(body),
        )
    finally:
        write.execute_prepared = execute
    if answer.status_code != 202 or len(captured) != 1:
        raise RuntimeError(f"the webhook was answered {answer.status_code} with {len(captured)} statements")
    return captured[0]


class Statements:
    """The intake's statement with a new event key each time, and the floor's insert."""

    def __init__(self, sql: str, params: list):
        from bench.intake_server import FLOOR_INSERT  # once Django is set up: it loads the site

        self.sql, self.params, self.floor_insert = sql, params, FLOOR_INSERT
        # The delivery's row is the JSON parameter that holds the event key (its dedupe key).
        self.row = next(n for n, p in enumerate(params) if isinstance(p, str) and '"event_key"' in p)

    def intake(self) -> tuple[str, list]:
        params = list(self.params)
        row = json.loads(params[self.row])
        row["event_key"] = secrets.token_hex(16)
        params[self.row] = json.dumps(row)
        return self.sql, [datetime.now(UTC) if isinstance(p, datetime) else p for p in params]

    def floor(self) -> tuple[str, list]:
        return self.floor_insert, [BODY]


def cost_us(conn, pid: int, make, statements: int) -> float:
    """The backend's CPU per statement, the lower of two blocks of ``statements``."""
    blocks = []
    for _ in range(2):
        started = process_cpu(pid)[1]
        for _ in range(statements):
            conn.execute(*make(), prepare=True).fetchall()
        blocks.append((process_cpu(pid)[1] - started) / statements * 1e6)
    return min(blocks)


def measure(url: str, statements: int) -> dict:
    env = base_env(DATABASE_URL=url, ANKUSA_STORE_SCOPE="node")
    tenant = prepare(env)
    os.environ.update(env)
    made = Statements(*captured_statement(tenant))
    costs = {}
    with psycopg.connect(url, autocommit=True) as admin, psycopg.connect(url, autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        for make in (made.floor, made.intake):  # warm: plans prepared, pages cached
            cost_us(conn, pid, make, max(statements // 10, 10))
        costs["floor"] = cost_us(conn, pid, made.floor, statements)
        costs["statement"] = cost_us(conn, pid, made.intake, statements)
        for what, finds in REMOVALS:
            for (drop,) in admin.execute(finds).fetchall():
                admin.execute(drop)
            costs[f"without {what}"] = cost_us(conn, pid, made.intake, statements)
        conn.execute("SET synchronous_commit = off")  # this connection only: the commit's share
        costs["without all that, commit asynchronous"] = cost_us(conn, pid, made.intake, statements)
        costs["floor, commit asynchronous"] = cost_us(conn, pid, made.floor, statements)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=3000, help="statements a block (default 3000)")
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test, not a measurement)")
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit(
            "DATABASE_URL must name a PostgreSQL server on this machine (its backend's CPU is read from /proc)"
        )
    statements = 200 if args.quick else args.statements
    with throwaway_database(url, "bench_statement") as database_url:  # dropped WITH (FORCE): Django's too
        costs = measure(database_url, statements)

    # A quick run's blocks are a few of the kernel's ticks long: a cost may read 0 there.
    statement, floor = max(costs["statement"], 1e-9), max(costs["floor"], 1e-9)
    removed = statement - costs["without other indexes"]
    committed = costs["without other indexes"] - costs["without all that, commit asynchronous"]
    print(f"\nPostgreSQL backend CPU per statement, one at a time, {statements} a block (the lower of two)")
    for step, us in costs.items():
        print(f"  {step:<42} {us:7.0f} µs   {us / floor:5.2f} x the floor")
    print(
        json.dumps(
            {
                "backend_us": {step: round(us) for step, us in costs.items()},
                "statement_vs_floor": round(statement / floor, 2),
                "removable_share": round(removed / statement, 3),
                "commit_share": round(committed / statement, 3),
                "statements": statements,
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    main()
