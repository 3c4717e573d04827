"""``GET /healthz`` (is this node able to do its work right now?) and ``GET /readyz``.

It checks the database with a ``SELECT 1`` and, when this site uses Redis (a fleet store, a Redis
queue, or ``REDIS_URL`` set explicitly), Redis with a ``PING``. 200 when every check passes, 503
naming the failing part otherwise. Each check has a short timeout so a hung dependency makes the
probe fail rather than hang.

``/readyz`` answers whether this node should take traffic: the database answers and every
migration this code knows is applied (so a node rolled out ahead of ``migrate`` stays out of the
load balancer). Once the migrations are seen applied the answer is remembered by the process,
since code cannot lose a migration while it runs.

``/healthz`` does not check the things a fleet survives: with ``ANKUSA_STORE_SCOPE=fleet`` intake keeps
answering from local state while Redis is down, but the probe still reports Redis as failing so
an operator sees it.
"""

from __future__ import annotations

import functools
import time

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import JsonResponse

from ankusa_site.core.probes import probe

REDIS_PROBE_TIMEOUT_S = 0.5


def redis_in_use() -> bool:
    """Whether some feature of this site talks to Redis."""
    backends = {settings.ANKUSA_QUEUE_BACKEND, *settings.ANKUSA_QUEUE_BACKENDS.values()}
    return settings.REDIS_CONFIGURED or settings.ANKUSA_STORE_SCOPE == "fleet" or "redis" in backends


@functools.lru_cache(maxsize=4)
def _probe_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=REDIS_PROBE_TIMEOUT_S, socket_connect_timeout=REDIS_PROBE_TIMEOUT_S
    )


def _timed(check) -> dict:
    started = time.perf_counter()
    try:
        check()
    except Exception as exc:  # noqa: BLE001 - any failure of a dependency is the answer
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    return {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 2)}


def check_database() -> dict:
    def run():
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")

    return _timed(run)


def check_redis() -> dict:
    return _timed(lambda: _probe_client(settings.REDIS_URL).ping())


@probe
def healthz(request):
    checks = {"database": check_database()}
    if redis_in_use():
        checks["redis"] = check_redis()
    failing = [name for name, result in checks.items() if not result["ok"]]
    body = {"status": "fail" if failing else "ok", "failing": failing, "checks": checks}
    return JsonResponse(body, status=503 if failing else 200)


_migrations_applied = False


def check_migrations() -> dict:
    global _migrations_applied
    if _migrations_applied:
        return {"ok": True}
    try:
        connection = connections[DEFAULT_DB_ALIAS]
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Exception as exc:  # noqa: BLE001 - a database that cannot answer is not ready
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if pending:
        names = [f"{migration.app_label}.{migration.name}" for migration, _ in pending]
        return {"ok": False, "error": f"{len(names)} unapplied: {', '.join(names[:5])}"}
    _migrations_applied = True
    return {"ok": True}


@probe
def readyz(request):
    checks = {"database": check_database()}
    checks["migrations"] = (
        check_migrations() if checks["database"]["ok"] else {"ok": False, "error": "no database"}
    )
    failing = [name for name, result in checks.items() if not result["ok"]]
    body = {"status": "fail" if failing else "ok", "failing": failing, "checks": checks}
    return JsonResponse(body, status=503 if failing else 200)
