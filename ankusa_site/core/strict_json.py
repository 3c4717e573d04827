"""The strict-JSON rule every door applies to a JSON body: UTF-8, JSON, and storable by every
database we run on (no NUL or lone surrogate, no number PostgreSQL's ``numeric`` refuses, at most
``MAX_JSON_DEPTH`` levels deep).

``parse_json`` answers ``(document, text)`` or a :class:`Refusal` (400 and what is wrong): the
webhook intake, the REST parser and the admin's JSON fields all use it, so one document is
answered the same way at each door. It does NOT judge the document's shape (that is the caller's).
``storable`` makes text we keep but did not choose (a receiver's answer) storable instead.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

# Database ids are 64-bit: a larger number names no row, and SQLite's driver cannot bind it.
MAX_ID = 2**63 - 1


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


# Strings that PostgreSQL's jsonb (and text) cannot hold: NUL and lone surrogates ("\ud800").
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str) -> str:
    """``text`` with what PostgreSQL's text and jsonb cannot hold (NUL, lone surrogates) replaced by
    U+FFFD: for text we keep but did not choose, such as a receiver's answer."""
    return _UNSTORABLE.sub("\ufffd", text) if _UNSTORABLE.search(text) else text


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
    if "e-" in literal or "E-" in literal or len(literal) > MAX_NUMBER_SCALE:
        exponent = Decimal(literal).as_tuple().exponent  # an int: the literal is finite
        if isinstance(exponent, int) and exponent < -MAX_NUMBER_SCALE:
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
