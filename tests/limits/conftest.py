"""Fixtures of the limits tests: an injected clock, both stores and a silent socket."""

from __future__ import annotations

import socket

import pytest
from django.conf import settings

from limits.admission import admit
from limits.store import LocalStore, RateLimited, RedisStore, forget_store

START_US = 1_800_000_000_000_000  # 2027-01-15, a fixed instant so answers never depend on the day


class Clock:
    """Microseconds since the epoch, moved only by the test."""

    def __init__(self, now_us: int = START_US):
        self.now_us = now_us

    def __call__(self) -> int:
        return self.now_us

    def advance(self, ms: float = 0, *, us: int = 0) -> None:
        self.now_us += int(ms * 1000) + us


def spend_burst(tenant, burst: int) -> None:
    """Admit ``burst`` requests of ``tenant`` at once, its whole hooks burst: the next is refused
    until time passes or its buckets are reset."""
    for _ in range(burst):
        admit(tenant, 0)
    assert isinstance(admit(tenant, 0).result, RateLimited)


@pytest.fixture(autouse=True)
def fresh_store():
    """Each test starts with a new process-wide store: no bucket outlives the test that filled it."""
    forget_store()
    yield
    forget_store()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def local_store(clock):
    return LocalStore(clock=clock)


@pytest.fixture
def redis_store(redis_client, clock):
    store = RedisStore(settings.REDIS_URL, timeout_ms=2000, clock=clock)
    yield store
    store.close()


@pytest.fixture(params=["local", "redis"])
def store(request):
    """The contract suite runs once against each implementation, with the same injected clock."""
    return request.getfixturevalue(f"{request.param}_store")


@pytest.fixture
def silent_socket():
    """A TCP port that accepts connections (the kernel completes them) and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
