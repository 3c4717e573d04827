"""What both front doors share at the HTTP level: reading a body under a limit (``read_body``, a
chunked one too), the strict JSON rule (``parse_json``: no NaN, no lone surrogates, no NUL, bounded
depth and numbers — what the database can store), the answer to an outcome that stored nothing
(``refusal``: status, ``{"error", "detail"}``, ``Retry-After``) and the per-endpoint metrics
(``measured``).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ankusa_site import metrics
from ankusa_site.middleware import body_encoding_problem, is_chunked, late, late_detail
from commands.intake.arrival import InFlight, Limited, Outcome, TooLarge, Unavailable, Unknown


@dataclass(frozen=True)
class Refusal:
    """A request refused before or by ``submit``: status, ``{"error", "detail"}`` and headers."""

    status: int
    code: str
    detail: str
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def data(self) -> dict:
        return {"error": self.code, "detail": self.detail}


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
    (``ankusa_site.metrics``: ``ankusa_intake_*{endpoint=...}``)."""

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
    ``ankusa_site.middleware``) is a 408, and its connection reads no more.
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


# Strings that PostgreSQL's jsonb (and text) cannot hold: NUL and lone surrogates ("\ud800").
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


# Deeper than this is not an event, it is an attack on a recursive parser somewhere downstream.
MAX_JSON_DEPTH = 64


def parse_json(body: bytes) -> tuple[Any, str] | Refusal:
    """``(document, text)`` of a UTF-8 JSON body that every database can store, or why not."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Refusal(400, "bad_encoding", f"The body is not UTF-8 (byte {exc.start}).")
    try:
        document = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        return Refusal(400, "bad_json", f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels.")
    except _TooLarge:
        return Refusal(400, "bad_json", "The JSON holds a number too large to store.")
    except _TooPrecise:
        detail = f"The JSON holds a number with more than {MAX_NUMBER_SCALE} digits after the decimal point."
        return Refusal(400, "bad_json", detail)
    except ValueError as exc:
        return Refusal(400, "bad_json", f"The body is not JSON: {str(exc)[:200]}")
    problem = unstorable(document) if _may_be_unstorable(text) else None
    if problem:
        return Refusal(400, "bad_json", problem)
    return document, text


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class _TooLarge(ValueError):
    pass


class _TooPrecise(ValueError):
    pass


# PostgreSQL's numeric (what jsonb holds a number as) keeps at most this many digits after the
# decimal point: "1e-16384" is valid JSON it refuses ("value overflows numeric format").
MAX_NUMBER_SCALE = 16_383


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999
        raise _TooLarge(literal)
    # Only a negative exponent or a long literal can pass the scale; Decimal is left for those.
    if ("e-" in literal or "E-" in literal or len(literal) > MAX_NUMBER_SCALE) and (
        Decimal(literal).as_tuple().exponent < -MAX_NUMBER_SCALE
    ):
        raise _TooPrecise(literal)
    return value


# What lets parse_json skip the walk of unstorable() on a text, with searches in C: a NUL or a
# lone surrogate can only come from an escape (the decoder refuses them raw), so a text without
# one of these escapes holds none; and the walk's depth limit can only be passed by a text whose
# brackets, outside strings, nest that deep — which needs at least that many opening brackets
# anywhere (counted first: two scans in C, where the nesting takes two substitutions and a walk).
# Either found: the walk decides (a pair of surrogates or an escaped backslash before "u0000" is a
# false alarm it clears).
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


_NESTING = {"[": 1, "{": 1, "]": -1, "}": -1}


def _may_be_unstorable(text: str) -> bool:
    if _SUSPECT_ESCAPE.search(text):
        return True
    if text.count("[") + text.count("{") < MAX_JSON_DEPTH:
        return False
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_NESTING.__getitem__, brackets)), default=0) >= MAX_JSON_DEPTH


def unstorable(document: Any) -> str | None:
    """What in a parsed document a database would refuse, walked without recursion."""
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels."
        if isinstance(node, dict):
            for key, value in node.items():
                if _UNSTORABLE.search(key):
                    return "The JSON holds a NUL character or a lone surrogate, which cannot be stored."
                stack.append((value, depth + 1))
        elif isinstance(node, list):
            stack.extend((value, depth + 1) for value in node)
        elif isinstance(node, str) and _UNSTORABLE.search(node):
            return "The JSON holds a NUL character or a lone surrogate, which cannot be stored."
        elif isinstance(node, float) and not math.isfinite(node):
            return "The JSON holds a number too large to store."
    return None
