"""Signed sends: the Standard Webhooks headers an http connector adds to what it sends.

A connector signs when it holds at least one signing secret (``Connector.signing_secrets``, written
only by ``commands.staff.connector_tools``). Every send then carries:

* ``webhook-id``: ``cmd_<command id>`` — the same on every attempt and resend of one command, so a
  receiver dedupes on it (a "make a new command" copy is a new command, with a new id); a test send
  from the console carries ``test_<random hex>`` and ``Ankusa-Test: true``;
* ``webhook-timestamp``: the send's Unix time in whole seconds (receivers refuse one more than
  about five minutes off, which is their replay guard);
* ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` once per secret,
  space-separated, so during a rotation a receiver holding either the old or the new secret
  accepts it. The body signed is the exact bytes sent.

Secrets are ``whsec_`` + base64 of 32 random bytes from ``secrets`` (the specification asks for 24
to 64). A secret is shown in full once, when it is made; everywhere after, :func:`hint` only.

Not guaranteed: that the receiver checks anything; a signature proves who sent the body and when,
not that it was sent once (the id is for that).
"""

from __future__ import annotations

import base64
import functools
import hmac
import secrets
import time
from typing import Any

PREFIX = "whsec_"
SECRET_BYTES = 32
# The headers a send sets for signing (lower case): a connector's own headers may not name them.
HEADERS = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature"})
TEST_HEADER = "Ankusa-Test"
RESERVED_HEADERS = HEADERS | {TEST_HEADER.lower()}
# How many secrets sign at once: a rotation needs two; a few more leave room, without a list to
# sign a hundred times per send.
MAX_SECRETS = 5


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def hint(secret: str) -> str:
    """How a secret is shown after it was made: its prefix and last four characters."""
    return f"{PREFIX}…{secret[-4:]}"


@functools.lru_cache(maxsize=1024)  # decoded once per secret, not once per send
def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


def signature(secret_values: list[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one ``v1,`` entry per secret, in the order given."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return " ".join(
        # hmac.digest: OpenSSL's one-shot HMAC, several times faster than an hmac.new() object.
        "v1," + base64.b64encode(hmac.digest(_key(value), signed, "sha256")).decode()
        for value in secret_values
    )


def message_id(command: Any) -> str:
    """The ``webhook-id`` of ``command``: its id, stable across its attempts."""
    return f"test_{command.pk}" if getattr(command, "is_test", False) else f"cmd_{command.pk}"


def send_headers(command: Any, body: bytes, now: float | None = None) -> dict[str, str]:
    """The headers a send of ``command`` adds beyond the connector's own: the signature when its
    connector signs, and the test marker on a console test send (``commands.staff.connector_tools``).
    ``now``: the send's Unix time (read here when not given)."""
    headers = {TEST_HEADER: "true"} if getattr(command, "is_test", False) else {}
    active = [entry["secret"] for entry in command.connector.signing_secrets or ()]
    if not active:
        return headers
    msg_id = message_id(command)
    timestamp = int(time.time() if now is None else now)
    headers["webhook-id"] = msg_id
    headers["webhook-timestamp"] = str(timestamp)
    headers["webhook-signature"] = signature(active, msg_id, timestamp, body)
    return headers
