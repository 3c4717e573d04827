"""Reaching the real services the tests run against, and what to do when one is not there.

A test that needs Redis or PostgreSQL and cannot reach it is skipped with the reason locally, so
a laptop without Redis still runs the rest. CI sets ``ANKUSA_REQUIRE_SERVICES=1``: there the same
situation is a failure, so a stopped service can never turn a red run green by skipping.
"""

from __future__ import annotations

import os
import socket
from typing import NoReturn
from urllib.parse import quote, urlsplit

import pytest


def services_required() -> bool:
    return os.environ.get("ANKUSA_REQUIRE_SERVICES", "").strip().lower() in ("1", "true", "yes", "on")


def require_service(name: str, reason: str) -> NoReturn:
    """Skip the current test, or fail it when CI requires every service."""
    message = f"{name} is not reachable: {reason}"
    if services_required():
        pytest.fail(f"{message} (ANKUSA_REQUIRE_SERVICES=1 turns this skip into a failure)", pytrace=False)
    pytest.skip(message)


def tcp_reachable(url: str, default_port: int, timeout: float = 1.0) -> str | None:
    """None when something accepts a TCP connection at the URL's host and port, else the error."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or default_port), timeout):
            return None
    except OSError as exc:
        return f"{parts.hostname}:{parts.port or default_port}: {exc}"


def database_url(settings_dict: dict) -> str:
    """The ``DATABASE_URL`` that names a connection's database (a subprocess reaches the same data)."""
    if settings_dict["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    user = quote(settings_dict.get("USER") or "")
    password = quote(settings_dict.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    port = f":{settings_dict['PORT']}" if settings_dict.get("PORT") else ""
    return f"postgres://{auth}{settings_dict.get('HOST') or '127.0.0.1'}{port}/{settings_dict['NAME']}"
