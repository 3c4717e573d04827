"""``intake.parse_json``: a body's JSON, refused when a database could not store it, with the walk
over the document skipped for texts that cannot hold anything unstorable."""

from __future__ import annotations

import pytest

from ankusa_site.core.strict_json import MAX_JSON_DEPTH, Refusal, parse_json


def refused(body: bytes) -> str | None:
    parsed = parse_json(body)
    return parsed.detail if isinstance(parsed, Refusal) else None


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


@pytest.mark.parametrize(
    "body",
    [
        b'{"a": "\\\\u0000"}',  # an escaped backslash, then the text u0000: no NUL
        b'{"face": "\\ud83d\\ude00"}',  # a surrogate pair is one character
        b'{"a": "' + b"[" * 200 + b'"}',  # brackets inside a string nest nothing
        nested(MAX_JSON_DEPTH - 1),
        b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH,
        b"[" + b",".join([b"[]"] * (2 * MAX_JSON_DEPTH)) + b"]",  # many brackets, nested two deep
        b'{"n": 1.5e300, "m": -2.5}',
        b'{"n": 1e-16383}',  # PostgreSQL's numeric keeps 16,383 digits after the point
        b'{"n": 0.' + b"1" * 16_383 + b"}",
    ],
)
def test_storable_documents_pass_whether_or_not_they_look_suspect(body):
    assert refused(body) is None


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"a": "x\\u0000"}', "NUL character"),
        (b'{"\\uDBFF": 1}', "lone surrogate"),
        (nested(MAX_JSON_DEPTH), f"deeper than {MAX_JSON_DEPTH} levels"),
        (b'{"n": 1e999}', "number too large"),
        (b'{"n": [-1E400]}', "number too large"),
        (b'{"n": 1e-16384}', "more than 16383 digits after the decimal point"),
        (b'{"n": 1.5E-16383}', "more than 16383 digits after the decimal point"),
        (b'{"n": 0e-20000}', "more than 16383 digits after the decimal point"),
        (b'{"n": 0.' + b"1" * 16_384 + b"}", "more than 16383 digits after the decimal point"),
    ],
)
def test_unstorable_documents_are_refused_with_what_is_wrong(body, detail):
    assert detail in refused(body)
