"""Where a provider puts the id of an event, so a redelivery of it is recognised as a duplicate.

A source names a location: a preset (``github`` → ``X-GitHub-Delivery``, ``standard`` →
``webhook-id``, ``svix`` → ``svix-id``, ``shopify`` → ``X-Shopify-Webhook-Id``, ``stripe`` → the
JSON body's ``id``), any header (``header:X-Request-Id``) or a JSON path into the body
(``json:data.object.id``, ``json:events.0.id``). ``none`` means the source does not dedupe.

Keys are scoped by tenant and source by the caller. A key longer than 200 bytes (UTF-8) is
replaced by ``sha256:<hex>`` of it, so a hostile sender cannot make the claim store or the
database index hold arbitrarily long keys, while two different long keys still stay different.

A source that dedupes bodies (``Source.dedupe_body``: providers that sign neither the event id nor
a timestamp) claims :func:`body_key` — the body's SHA-256 — instead of the event key: the same
claim, scoped the same way, so a body accepted within the claim TTL is answered as a duplicate
whatever id it arrives under; the event key still guards the delivery in the database.

What it does not do: it does not decide what a missing key means (the intake does), and it never
trusts a key to be unique across sources.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from commands.intake.headers import Headers

MAX_KEY_BYTES = 200

PRESETS = {
    "github": "header:X-GitHub-Delivery",
    "standard": "header:webhook-id",
    "svix": "header:svix-id",
    "shopify": "header:X-Shopify-Webhook-Id",
    "stripe": "json:id",
}

_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,100}$")
_PATH_PART = re.compile(r"^[^.\s]{1,100}$")
_NOT_PARSED = object()


class EventKeyConfigError(ValueError):
    def __init__(self, message: str):
        super().__init__(f"dedupe key location: {message}")
        self.message = message


def resolve(location: str) -> tuple[str, str] | None:
    """``(kind, detail)`` for a location (``("header", "X-GitHub-Delivery")``), None for ``none``.

    Raises ``EventKeyConfigError`` for a location that can never yield a key.
    """
    if not isinstance(location, str):
        raise EventKeyConfigError("must be a string")
    location = location.strip()
    if location in ("", "none"):
        return None
    location = PRESETS.get(location, location)
    kind, sep, detail = location.partition(":")
    if not sep or kind not in ("header", "json"):
        names = ", ".join(["none", *PRESETS])
        raise EventKeyConfigError(f"{location!r} is not a preset ({names}), header:<Name> or json:<path>")
    if kind == "header" and not _HEADER_NAME.match(detail):
        raise EventKeyConfigError(f"{detail!r} is not a valid header name")
    if kind == "json":
        parts = detail.split(".")
        if not detail or len(parts) > 20 or not all(_PATH_PART.match(p) for p in parts):
            raise EventKeyConfigError(f"{detail!r} is not a dotted JSON path such as data.object.id")
    return kind, detail


def body_key(body: bytes) -> str:
    """The claim key of a body: ``body:sha256:<hex>`` (no event key can be mistaken for it: a
    source that dedupes bodies claims only these)."""
    return "body:sha256:" + hashlib.sha256(body).hexdigest()


def needs_json(location: str) -> bool:
    resolved = resolve(location)
    return resolved is not None and resolved[0] == "json"


def normalise(key: str) -> str:
    """The key as stored: unchanged up to 200 bytes, else its SHA-256."""
    encoded = key.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_KEY_BYTES:
        return key
    return "sha256:" + hashlib.sha256(encoded).hexdigest()


def _walk(document: Any, path: str) -> Any:
    node = document
    for part in path.split("."):
        if isinstance(node, Mapping):
            if part not in node:
                return None
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def extract(
    location: str, headers: Mapping[str, str] | Headers, body: bytes, parsed: Any = _NOT_PARSED
) -> str | None:
    """The event key of one request, or None when the request carries none.

    ``parsed`` is the already-decoded JSON body, when the caller has it (no second parse).
    Only strings and integers are keys: a JSON object or a boolean where an id should be is
    treated as missing rather than turned into a key that could collide.
    """
    resolved = resolve(location)
    if resolved is None:
        return None
    kind, detail = resolved
    if kind == "header":
        value = Headers.of(headers).stripped(detail)
        return normalise(value) if value else None
    if parsed is _NOT_PARSED:
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None
    value = _walk(parsed, detail)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    value = str(value).strip()
    return normalise(value) if value else None
