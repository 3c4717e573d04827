"""API tokens: how machines authenticate to the REST API, and why a leaked database does not leak them.

A token is ``ank_<key id>_<secret>``. The key id is public (it is shown in the admin and in logs
to tell tokens apart); the secret is shown **once**, when the token is issued, and only its
SHA-256 is stored. A 256-bit random secret needs no slow hash: nobody can guess it, so the hash
only has to make the stored value useless to whoever reads the table.

A token belongs to exactly one of:
* a **tenant** — the client acts as that tenant: it reaches only that tenant's connectors,
  commands and deliveries, and holds no staff permission;
* a **staff user** — the client acts as that user, with that user's permissions.

Requests send ``Authorization: Bearer ank_…``. A revoked token, a tenant that is not active or a
user who is not active is refused. ``last_used_at`` is written at most once a minute per token,
so authentication is not a database write per request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.utils import timezone

PREFIX = "ank"
# A conditional UPDATE at most this often per token: often enough to spot unused tokens.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def new_key() -> tuple[str, str, str]:
    """``(plaintext, key_id, key_hash)`` for a new token."""
    key_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return f"{PREFIX}_{key_id}_{secret}", key_id, hash_secret(secret)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split(plaintext: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed token, else None."""
    prefix, sep, rest = plaintext.partition("_")
    key_id, sep2, secret = rest.partition("_")
    if prefix != PREFIX or not sep or not sep2 or len(key_id) != 12 or not secret:
        return None
    return key_id, secret


def secret_matches(secret: str, key_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), key_hash)


def display(key_id: str) -> str:
    """How a token is shown after it was issued: its public part only."""
    return f"{PREFIX}_{key_id}_…"


def touch(token, now=None) -> None:
    """Record use, at most once per ``LAST_USED_RESOLUTION``."""
    from django.db.models import Q

    now = now or timezone.now()
    stale = Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
    # The token's own model, not an import of limits.models (which imports this module).
    type(token)._default_manager.filter(Q(pk=token.pk) & stale).update(last_used_at=now)
