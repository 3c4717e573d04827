"""The quota and claim store: ``get_store()`` is the one this process uses.

``ANKUSA_STORE_SCOPE=node`` gives a ``LocalStore`` (this process's memory); ``fleet`` gives a
``FleetStore`` (Redis at ``REDIS_URL`` with ``ANKUSA_STORE_TIMEOUT_MS`` per call, falling back to a
``LocalStore``). The store is built on first use, once per process (a forked worker builds its
own), and building it connects to nothing, so a Redis outage never blocks start-up. The contract
is in ``limits.store.base``; ``limits.admission`` is what the intake calls.
"""

from __future__ import annotations

import os
import threading

from django.conf import settings

from limits.store.base import (
    Charge,
    Claim,
    Duplicate,
    Error,
    Exceeds,
    Ok,
    Pending,
    RateLimited,
    Result,
    Settle,
    Store,
)
from limits.store.fleet import FleetStore
from limits.store.local import LocalStore
from limits.store.redis import RedisStore

__all__ = [
    "Charge",
    "Claim",
    "Duplicate",
    "Error",
    "Exceeds",
    "FleetStore",
    "LocalStore",
    "Ok",
    "Pending",
    "RateLimited",
    "RedisStore",
    "Result",
    "Settle",
    "Store",
    "build_store",
    "forget_store",
    "get_store",
]

_lock = threading.Lock()
_store: tuple[int, Store] | None = None


def get_store() -> Store:
    """This process's store (a dictionary lookup after the first call)."""
    global _store
    current = _store
    if current is not None and current[0] == os.getpid():
        return current[1]
    with _lock:
        if _store is None or _store[0] != os.getpid():
            _store = (os.getpid(), build_store())
        return _store[1]


def build_store() -> Store:
    """A new store as the settings describe it."""
    if settings.ANKUSA_STORE_SCOPE == "node":
        return LocalStore()
    return FleetStore(
        RedisStore(settings.REDIS_URL, timeout_ms=settings.ANKUSA_STORE_TIMEOUT_MS),
        LocalStore(),
        threshold=settings.ANKUSA_FLEET_BREAKER_THRESHOLD,
        cooldown_ms=settings.ANKUSA_FLEET_BREAKER_COOLDOWN_MS,
    )


def forget_store() -> None:
    """Drop this process's store; the next ``get_store()`` builds one from the current settings."""
    global _store
    with _lock:
        _store = None
