"""The site's error answer, ``{"error": code, "detail": text}``, for code that answers outside DRF:
middleware, the probes, the URL fallbacks and Django's error handlers. It imports nothing of DRF,
so modules loaded before DRF reads its settings (the metrics, which the stores import) can use it.

It also holds the one mapping from "a service this request needs did not answer" to its answer:
``unreachable(exc)`` names the service (the database: Django's ``OperationalError`` or
``InterfaceError``, whatever the vendor; Redis: a connection error or a timeout), and the answer
is 503 ``unavailable`` with ``Retry-After`` — never a 500. The REST API's error handler
(``ankusa_site.core.api.json_errors``) and the plain views that answer JSON (a webhook's,
``answer_unreachable``) both use it, so every database read on their way is covered, the ones
behind a cache included. What it does not know: whether a write of the failed request reached the
database. Its text says so for a request that may change something; the intake, which knows how
far its own write got, answers for itself (``commands.intake.write``).
"""

from __future__ import annotations

import functools
import logging

import psycopg
from django.db import InterfaceError, OperationalError
from django.http import JsonResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ankusa_site.core.logs import log_event

logger = logging.getLogger("ankusa.site")

# Paths whose every answer, an error included, is JSON: the REST API and the webhooks.
JSON_PREFIXES = ("/api/", "/hooks/")
# A database restart or a failover takes seconds: a retry after one finds it back soon enough, and
# what a client retries more often than that is one request a second, which the site answers cheaply.
RETRY_AFTER_S = 1
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def error(code: str, detail: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": code, "detail": detail}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def wants_json(request) -> bool:
    return request.path.startswith(JSON_PREFIXES)


def unreachable(exc: BaseException) -> str | None:
    """The service ``exc`` says did not answer (``"database"``, ``"Redis"``); None: another error.

    Django raises ``OperationalError`` when it cannot connect, when the server ends the session or
    the connection breaks, and for a statement the server cancelled (a timeout, a shutdown);
    ``InterfaceError`` for a connection already closed (psycopg's own, unwrapped, count too). All
    are worth a retry; none is the request's fault. A ``redis`` reply error (a bug, a full memory) is not an outage."""
    if isinstance(exc, OperationalError | InterfaceError | psycopg.OperationalError | psycopg.InterfaceError):
        return "database"
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return "Redis"
    return None


def unavailable_detail(service: str, method: str, *, wrote: bool = True) -> str:
    """What is known when ``service`` failed somewhere on a request's way: that it did, and, for a
    request that may write (``wrote``: it may have; not a safe method), not whether it did."""
    detail = f"The {service} did not answer; retry after the time in Retry-After."
    if not wrote:
        return f"The {service} did not answer; nothing was stored. Retry after the time in Retry-After."
    if method.upper() not in SAFE_METHODS:
        detail += " Whether this request changed anything is not known: check before repeating it."
    return detail


def log_unreachable(request, service: str, exc: BaseException) -> None:
    log_event(
        logger,
        "service_unreachable",
        level=logging.WARNING,
        service=service,
        path=request.path[:200],
        error=f"{type(exc).__name__}: {exc}"[:300],
    )


def answer_unreachable(*, wrote: bool = True):
    """A plain view whose exceptions that ``unreachable`` names are answered 503 ``unavailable``
    with ``Retry-After`` (JSON), instead of the site's 500. ``wrote=False``: no write of the view
    can fail into this answer (the intake's doors, whose one write answers for itself), so its text
    says that nothing was stored."""

    def wrap(view):
        @functools.wraps(view)
        def answered(request, *args, **kwargs):
            try:
                return view(request, *args, **kwargs)
            except Exception as exc:
                service = unreachable(exc)
                if service is None:
                    raise
                log_unreachable(request, service, exc)
                detail = unavailable_detail(service, request.method, wrote=wrote)
                return error("unavailable", detail, 503, Retry_After=str(RETRY_AFTER_S))

        return answered

    return wrap
