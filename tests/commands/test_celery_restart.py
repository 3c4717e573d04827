"""A Celery process keeps its dispatcher between drains (``commands.tasks._drain``) and its
database connections between tasks (``ankusa_site.celery``), on a PostgreSQL cluster of the test's
own: a real worker connects once for many tasks, and when the cluster restarts (``-m immediate``)
between two of its drains it sends again on the same dispatcher."""

from __future__ import annotations

import sys

import psycopg
import pytest

from tests.commands.children import stop
from tests.commands.outage import set_up
from tests.commands.test_celery_engine import beat, worker
from tests.private_services import MIGRATED
from tests.servers import wait_for

pytestmark = [pytest.mark.slow]


def succeeded(database_url: str) -> int:
    try:
        with psycopg.connect(database_url, connect_timeout=2) as db:
            return db.execute("SELECT count(*) FROM commands_command WHERE state = 'succeeded'").fetchone()[0]
    except psycopg.OperationalError:  # restarting
        return -1


def accepted(node, delivery: str) -> bool:
    # This source dedupes on the body too: each event its own. 200: a retry of one stored before a 503.
    return node.hook(delivery, f'{{"event": "{delivery}"}}'.encode())[0] in (200, 202)


def connections_opened(cluster, application: str) -> int:
    with open(cluster.log) as log:
        return sum(
            f"application_name={application}" in line for line in log if "connection authorized" in line
        )


def test_a_celery_worker_keeps_its_database_connections_from_one_task_to_the_next(
    migrated_postgres, service_env, start_node, tmp_path
):
    with psycopg.connect(migrated_postgres.url(), autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET log_connections = on")
        admin.execute("SELECT pg_reload_conf()")
    site = set_up(service_env, migrated_postgres.url(MIGRATED))
    env = {**service_env, "DATABASE_URL": site.database_url, "ANKUSA_DISPATCH_CELERY_WAKE": "1"}
    node = start_node(workers=1, threads=2, **env)
    # As deployed: tasks in a pool process (one, so every task runs in the same); its connections named.
    worker_env = {**env, "DATABASE_URL": f"{site.database_url}?application_name=celery-pool"}
    sender = worker(sys.executable, worker_env, "kept", ("--pool", "prefork", "--concurrency", "1"))
    scheduler = beat(sys.executable, env, tmp_path)  # a poll task every second besides the wakes'
    try:
        wait_for(lambda: sender.has("ready."), timeout=60, what="the worker to start")
        assert accepted(node, "first")
        wait_for(lambda: succeeded(site.database_url) == 1, timeout=30, what="the first send")
        opened = connections_opened(migrated_postgres, "celery-pool")
        for n in range(3):
            assert accepted(node, f"next-{n}")
            wait_for(lambda n=n: succeeded(site.database_url) == n + 2, timeout=30, what="the next send")
        wait_for(lambda: sender.text().count("Task commands.poll[") >= 8, timeout=30, what="beat's polls")
    finally:
        stop(scheduler)
        output = stop(sender)
        print(output)  # shown when the test fails
    assert opened >= 1  # the first drain's: its own, its start thread's and its recorder's
    # Celery's own habit would have opened one for every task since (Django's fixup closes them).
    assert connections_opened(migrated_postgres, "celery-pool") == opened


def test_a_celery_worker_sends_again_after_its_database_restarts_between_two_drains(
    migrated_postgres, service_env, start_node, tmp_path
):
    site = set_up(service_env, migrated_postgres.url(MIGRATED))
    env = {**service_env, "DATABASE_URL": site.database_url, "ANKUSA_DISPATCH_CELERY_WAKE": "1"}
    node = start_node(workers=1, threads=2, **env)
    sender = worker(sys.executable, env, "restart")
    scheduler = beat(sys.executable, env, tmp_path)  # its poll, should a wake go missing
    try:
        wait_for(lambda: sender.has("ready."), timeout=60, what="the worker to start")
        assert accepted(node, "before")  # its commit asks the worker for a drain
        wait_for(lambda: succeeded(site.database_url) == 1, timeout=30, what="the first send")

        migrated_postgres.stop("immediate")
        migrated_postgres.start()
        wait_for(lambda: accepted(node, "after"), timeout=30, what="the site to take a webhook again")
        wait_for(lambda: succeeded(site.database_url) == 2, timeout=30, what="the send after the restart")
    finally:
        stop(scheduler)
        output = stop(sender)
        print(output)  # shown when the test fails
    # Every drain ended well: none failed on a connection the restart broke and left it to a new one.
    assert "raised unexpected" not in output
    assert output.count("Task commands.poll[") >= 2
