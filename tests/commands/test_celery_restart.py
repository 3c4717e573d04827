"""A Celery process keeps its dispatcher between drains (``commands.tasks._drain``): a real worker
whose database restarts between two of its drains sends again on the same dispatcher, on a
PostgreSQL cluster of the test's own that is restarted (``-m immediate``)."""

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
