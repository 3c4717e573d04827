"""Fixtures of the queue tests: one queue per backend, an injected clock, and the queue log."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from queues.backends.database import DatabaseFIFO
from queues.backends.redis import RedisFIFO

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime = START):
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture(params=["database", "redis"])
def backend(request):
    """Each contract test runs once per backend: the database one on whatever database this run
    uses (SQLite or PostgreSQL), and Redis. The test module marks itself ``django_db`` (or asks for
    ``transactional_db``): pytest-django sets up the test database only for tests it can see need
    it, so a fixture cannot ask for one on its own."""
    if request.param == "redis":
        request.getfixturevalue("django_redis")
    return request.param


@pytest.fixture
def make_queue(backend, clock):
    """Build a queue of the backend under test: ``make_queue(name="jobs", requeue_limit=5)``."""

    def make(name: str = "jobs", **options):
        options.setdefault("clock", clock)
        cls = DatabaseFIFO if backend == "database" else RedisFIFO
        return cls(name, **options)

    return make


@pytest.fixture
def queue(make_queue):
    return make_queue()


@pytest.fixture
def queue_log(caplog):
    """Records of the ``ankusa`` loggers (which do not propagate to the root logger caplog watches)."""
    logger = logging.getLogger("ankusa")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="ankusa")
    yield caplog
    logger.removeHandler(caplog.handler)
