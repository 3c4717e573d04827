"""Fixtures shared by every test: real Redis, a private redis-server, the test database, and
subprocess environments."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import redis
from django.conf import settings
from django.test import Client
from django.test.client import ClientHandler

from ankusa_site.handlers import HookShortcut
from tests.api_world import call, world  # noqa: F401 - the REST API tests' fixtures
from tests.private_services import PrivateRedis
from tests.servers import Node
from tests.services import database_url, require_service, tcp_reachable


class SiteClient(Client):
    """Django's test client through the site's handler (``ankusa_site.handlers``), as gunicorn
    serves it: a webhook takes the shortcut to its view."""

    def __init__(self, enforce_csrf_checks=False, **defaults):
        super().__init__(enforce_csrf_checks, **defaults)
        self.handler = SiteClientHandler(enforce_csrf_checks)


class SiteClientHandler(HookShortcut, ClientHandler):
    pass


@pytest.fixture
def client():
    return SiteClient()


def pytest_collection_modifyitems(config, items):
    """Under ``ANKUSA_STOCK_DJANGO`` (``ankusa_site.core.stock``) a test marked ``fast_path`` holds
    something only a fast path does (a statement count, a prepared statement): skipped there."""
    if not settings.ANKUSA_STOCK_DJANGO:
        return
    skip = pytest.mark.skip(
        reason=f"fast path only; ANKUSA_STOCK_DJANGO={','.join(sorted(settings.ANKUSA_STOCK_DJANGO))}"
    )
    for item in items:
        if item.get_closest_marker("fast_path"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def database_reachable():
    """Skip (or, under CI, fail) every database test when PostgreSQL does not answer."""
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("postgresql"):
        problem = tcp_reachable(f"postgres://{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}", 5432)
        if problem:
            require_service("PostgreSQL", problem)


@pytest.fixture(scope="session")
def django_db_setup(database_reachable, django_db_setup):
    """pytest-django's own test database set-up, once PostgreSQL is known to answer."""
    return django_db_setup


@pytest.fixture
def redis_client():
    """A real Redis connection on the tests' own database number, flushed before and after."""
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        require_service("Redis", f"{settings.REDIS_URL}: {exc}")
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def start_private_redis(tmp_path):
    """Start a private redis-server (optionally with a password); each is killed after the test."""
    binary = shutil.which("redis-server")
    if binary is None:
        require_service("redis-server", "the redis-server binary is not installed")
    servers = []

    def start(password: str = "") -> PrivateRedis:
        server = PrivateRedis(binary, tmp_path, password)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def private_redis(start_private_redis):
    return start_private_redis()


@pytest.fixture
def django_redis(redis_client):
    """The site's own django-redis connection (what the code under test uses), on the test database."""
    from django_redis import get_redis_connection

    return get_redis_connection("redis")


@pytest.fixture
def postgres(db):
    """Marks a test that only means something on PostgreSQL (run it with DATABASE_URL=postgres://...)."""
    if not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        pytest.skip("PostgreSQL-only: DATABASE_URL names SQLite in this run")


@pytest.fixture
def service_env():
    """Environment for a subprocess that must see this test's database and Redis.

    Use with ``transactional_db`` so the rows the test writes are committed where the subprocess
    can read them.
    """
    return _subprocess_env(database_url(settings.DATABASES["default"]))


def _subprocess_env(database: str) -> dict:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=database,
        ANKUSA_TEST_REDIS_DB=str(settings.TEST_REDIS_DB),
        PYTHONPATH=os.pathsep.join([str(settings.BASE_DIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def python():
    return sys.executable


@pytest.fixture
def start_node(service_env, tmp_path):
    """Start gunicorn nodes on free ports with this test's database and Redis; stopped after."""
    nodes = []

    def start(workers: int = 2, threads: int = 8, args: tuple = (), **env: str) -> Node:
        node = Node(
            {**service_env, **env},
            tmp_path / f"gunicorn-{len(nodes)}.log",
            workers=workers,
            threads=threads,
            args=args,
        )
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        node.stop()


def _private_bindir() -> str:
    from tests.private_services import postgres_bindir

    bindir = postgres_bindir()
    if bindir is None:
        require_service("PostgreSQL binaries", "initdb is not installed")
    return bindir


@pytest.fixture
def private_postgres():
    """A started PostgreSQL cluster of this test's own (``tests.private_services``), destroyed after."""
    from tests.private_services import PrivatePostgres

    cluster = PrivatePostgres(_private_bindir())
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def migrated_cluster():
    """A stopped PostgreSQL cluster with the database ``MIGRATED`` migrated: the files each
    ``migrated_postgres`` starts from (``manage.py migrate`` once a run instead of once a test)."""
    from tests.private_services import MIGRATED, PrivatePostgres

    cluster = PrivatePostgres(_private_bindir())
    try:
        cluster.start()
        env = _subprocess_env(cluster.create_database(MIGRATED))
        migrated = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert migrated.returncode == 0, migrated.stderr
        cluster.stop()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def migrated_postgres(migrated_cluster):
    """As ``private_postgres``, with the database ``MIGRATED`` migrated (``url(MIGRATED)``)."""
    from tests.private_services import PrivatePostgres

    cluster = PrivatePostgres(migrated_cluster.bindir, copy_of=migrated_cluster)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
