"""What both front doors share at the HTTP level: reading a body under a limit (``read_body``, a
chunked one too), the answer to an outcome that stored nothing (``refusal``: status, ``{"error",
"detail"}``, ``Retry-After``) and the per-endpoint metrics (``measured``). The strict JSON rule
both apply to a body is ``ankusa_site.core.strict_json`` (the REST parser and the admin use it too).
"""

from __future__ import annotations

import functools
import math
import time

from ankusa_site.core import metrics
from ankusa_site.core.middleware import body_encoding_problem, is_chunked, late, late_detail
from ankusa_site.core.strict_json import Refusal
from commands.intake.arrival import InFlight, Limited, Outcome, TooLarge, Unavailable, Unknown


def retry_after_s(ms: int) -> str:
    """``Retry-After`` in whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(ms / 1000)))


def refusal(outcome: Outcome) -> Refusal | None:
    """The answer to an outcome that stored nothing (None for ``Accepted`` and ``Duplicated``)."""
    match outcome:
        case Limited(retry_after_ms=ms, headers=headers):
            return Refusal(
                429,
                "rate_limited",
                "The tenant's quota is spent; retry after the time in Retry-After.",
                {**headers, "Retry-After": retry_after_s(ms)},
            )
        case TooLarge(kind=kind, headers=headers):
            return Refusal(413, "too_large", f"The body can never pass the tenant's {kind} limit.", headers)
        case InFlight(retry_after_ms=ms, headers=headers):
            return Refusal(
                409,
                "in_flight",
                "Another request with this key is being stored; retry after the time in Retry-After.",
                {**headers, "Retry-After": retry_after_s(ms)},
            )
        case Unavailable(reason=reason, headers=headers):
            return Refusal(
                503, "unavailable", f"Nothing was stored ({reason}); retry.", {**headers, "Retry-After": "1"}
            )
        case Unknown(deduped=deduped, webhook=webhook, headers=headers):
            return Refusal(
                503, "unavailable", _unknown_detail(deduped, webhook), {**headers, "Retry-After": "1"}
            )
    return None


def _unknown_detail(deduped: bool, webhook: bool) -> str:
    detail = (
        "The outcome is unknown: the connection to the database broke after the write was sent, "
        "so it may have been stored. "
    )
    if deduped:
        return detail + "Retry: if it was stored, the retry is answered as a duplicate."
    if webhook:
        return detail + "This source does not dedupe its events: a retry may store it a second time."
    return detail + "Without an Idempotency-Key a retry may store it a second time; send one to retry safely."


def measured(endpoint: str):
    """Count a front door's answers by status, the declared request size and the time to answer
    (``ankusa_site.core.metrics``: ``ankusa_intake_*{endpoint=...}``)."""

    def wrap(view):
        @functools.wraps(view)
        def counted(request, *args, **kwargs):
            started = time.perf_counter()
            response = view(request, *args, **kwargs)
            metrics.labelled(metrics.INTAKE_RESPONSES, endpoint, str(response.status_code)).inc()
            declared = request.META.get("CONTENT_LENGTH") or ""
            if declared.isdigit():
                metrics.labelled(metrics.INTAKE_REQUEST_BYTES, endpoint).observe(int(declared))
            metrics.labelled(metrics.INTAKE_LATENCY, endpoint).observe(time.perf_counter() - started)
            return response

        return counted

    return wrap


def read_body(request, limit: int, *, endpoint: str) -> bytes | Refusal:
    """The request body, never reading more than ``limit`` + 1 bytes of it.

    A ``Content-Length`` over the limit is refused before anything is read. A chunked body (no
    ``Content-Length``; Django's own stream would read nothing) is read from the server's input
    stream, only up to the limit. What was read is counted in ``ankusa_intake_body_bytes``.

    A body that does not arrive within ``ANKUSA_BODY_TIMEOUT_S`` (under gunicorn:
    ``ankusa_site.core.middleware``) is a 408, and its connection reads no more.
    """
    try:
        body = _read(request, limit)
    except Exception:
        if not late(request):
            raise
        body = None
    if late(request):  # whatever came of the read: its end was the deadline's
        return Refusal(408, "request_timeout", late_detail())
    if isinstance(body, Refusal):
        return body
    metrics.labelled(metrics.INTAKE_BODY_BYTES, endpoint).observe(len(body))
    if len(body) > limit:
        return Refusal(413, "too_large", f"The body is larger than this tenant's {limit} bytes.")
    return body


def _read(request, limit: int) -> bytes | Refusal:
    if problem := body_encoding_problem(request.META):
        return Refusal(415, "unsupported_media_type", problem)
    if is_chunked(request.META):
        try:
            return _read_chunked(request.META["wsgi.input"], limit)
        except Exception:  # each WSGI server has its own errors for a malformed or cut-off chunk
            return Refusal(400, "bad_request", "The chunked body is malformed or was cut off.")
    declared = (request.META.get("CONTENT_LENGTH") or "0").strip()
    if not (declared.isascii() and declared.isdigit()):
        return Refusal(400, "bad_request", "Content-Length is not a whole number.")
    if int(declared) > limit:
        return Refusal(413, "too_large", f"The body is larger than this tenant's {limit} bytes.")
    try:
        body = request.read(limit + 1)
    except OSError:  # Django's UnreadablePostError: the client went away mid-body
        return Refusal(400, "bad_request", "The body was cut off.")
    if len(body) < int(declared):  # the client closed its side before sending all of it
        return Refusal(
            400, "bad_request", f"The body was cut off: Content-Length is {declared}, {len(body)} bytes came."
        )
    return body


def _read_chunked(stream, limit: int) -> bytes:
    """What the server decoded of a chunked body, at most ``limit`` + 1 bytes of it."""
    chunks, size = [], 0
    while size <= limit:
        chunk = stream.read(min(64 * 1024, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
