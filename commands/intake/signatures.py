"""Webhook signature verifiers: is this body really from the provider the source names?

Presets cover the providers' own schemes — GitHub (``X-Hub-Signature-256``), Stripe
(``Stripe-Signature``, with a timestamp tolerance), Standard Webhooks and Svix
(``webhook-id``/``-timestamp``/``-signature``), Shopify (``X-Shopify-Hmac-Sha256``) — plus a
generic HMAC header whose name, algorithm, encoding and prefix are configured.

Why it is safe:
* every comparison is ``hmac.compare_digest`` (constant time), so a forger learns nothing from
  how long a refusal took;
* each verifier takes a **list** of secrets and accepts a signature made with any of them, so a
  provider's secret can be rotated without a window of refused webhooks (add the new one, then
  remove the old once the provider signs with it);
* timestamped schemes (Stripe, Standard Webhooks) refuse a timestamp more than the tolerance
  (5 minutes, the providers' own default) away from now, so a captured request cannot be
  replayed later; the time is an argument, never read here.

What it does not do: it does not dedupe (a replay inside the tolerance passes here and is caught
by the event-key claim), and it never logs or returns a secret or the expected signature. GitHub's
and Shopify's schemes sign the body alone (``UNTIMESTAMPED``): a captured webhook re-sent later,
even under a new delivery id, verifies; a source's ``dedupe_body`` catches that within the claim
TTL (``commands.intake.event_keys.body_key``).

A bad configuration (unknown scheme, no secret, a Standard Webhooks secret that is not base64)
raises ``VerifierConfigError`` naming the field, so it fails when staff save the source rather
than on the first webhook.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from commands.intake.headers import Headers

# The providers' own default: Stripe's and Standard Webhooks' libraries both use 300 s.
DEFAULT_TOLERANCE_S = 300

ALGORITHMS: dict[str, Callable] = {"sha1": hashlib.sha1, "sha256": hashlib.sha256, "sha512": hashlib.sha512}
ENCODINGS = ("hex", "base64")


class VerifierConfigError(ValueError):
    """A verifier configuration that can never work; ``field`` names what to fix."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _mac(algorithm: str, secret: bytes, message: bytes) -> bytes:
    return hmac.new(secret, message, ALGORITHMS[algorithm]).digest()


def _matches(candidates: Sequence[bytes], expected: Sequence[bytes]) -> bool:
    # Compare every pair even after a match, so the time taken does not tell which secret matched.
    found = False
    for candidate in candidates:
        for value in expected:
            found |= hmac.compare_digest(candidate, value)
    return found


def _decode(value: str, encoding: str) -> bytes | None:
    try:
        if encoding == "hex":
            return bytes.fromhex(value)
        return base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        return None


# Unix seconds in ASCII digits: ``str.isdigit`` also takes "²" and other digits ``int`` refuses,
# and a number too long to compare with the clock overflows a float. Twelve digits last until the
# year 33658.
TIMESTAMP = re.compile(r"[0-9]{1,12}")


def _timestamp(raw: str | None, now: float, tolerance_s: int) -> tuple[int | None, str | None]:
    if raw is None or not TIMESTAMP.fullmatch(raw):
        return None, "missing or malformed timestamp"
    stamp = int(raw)
    if abs(now - stamp) > tolerance_s:
        return None, f"timestamp outside the {tolerance_s} s tolerance (replayed or clock skew)"
    return stamp, None


def _secrets(secrets: Sequence[str]) -> list[str]:
    if isinstance(secrets, str | bytes) or not isinstance(secrets, Sequence):
        raise VerifierConfigError("secrets", "must be a list of strings")
    cleaned = [s for s in secrets if isinstance(s, str) and s.strip()]
    if not cleaned or len(cleaned) != len(secrets):
        raise VerifierConfigError(
            "secrets", "give at least one non-empty secret; every entry must be a string"
        )
    return cleaned


@dataclass(frozen=True)
class Verifier:
    """Base: ``verify(headers, body, now)`` returns ``None`` when the signature holds, else why not."""

    secrets: Sequence[str]
    options: Mapping = field(default_factory=dict)

    kind = "base"
    allowed_options = ()

    def __post_init__(self):
        object.__setattr__(self, "secrets", _secrets(self.secrets))
        if not isinstance(self.options, Mapping):
            raise VerifierConfigError("options", "must be an object")
        unknown = sorted(set(self.options) - set(self.allowed_options))
        if unknown:
            allowed = ", ".join(self.allowed_options) or "none"
            raise VerifierConfigError(
                "options", f"unknown option(s) {', '.join(unknown)}; allowed: {allowed}"
            )
        self.validate()

    def validate(self) -> None:
        """Check ``options`` and ``secrets`` beyond their shape; raise ``VerifierConfigError``."""

    def verify(self, headers: Mapping[str, str], body: bytes, now: float) -> str | None:
        raise NotImplementedError

    def sign(self, body: bytes, now: float, *, secret: str | None = None, **extra) -> dict[str, str]:
        """The headers a provider would send (for tests, benchmarks and the demo)."""
        raise NotImplementedError

    @property
    def tolerance_s(self) -> int:
        return int(self.options.get("tolerance_s", DEFAULT_TOLERANCE_S))

    def _check_tolerance(self) -> None:
        value = self.options.get("tolerance_s", DEFAULT_TOLERANCE_S)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 86_400:
            raise VerifierConfigError(
                "options.tolerance_s", "must be a whole number of seconds from 1 to 86400"
            )


class NoVerifier(Verifier):
    """Accept every body (a source that is reached only through a private network)."""

    kind = "none"

    def __post_init__(self):
        if self.options:
            raise VerifierConfigError("options", "the 'none' verifier takes no options")

    def verify(self, headers, body, now):
        return None

    def sign(self, body, now, *, secret=None, **extra):
        return {}


class HmacHeaderVerifier(Verifier):
    """One header holding ``prefix + encode(HMAC(secret, body))`` — the generic scheme."""

    kind = "hmac"
    allowed_options = ("header", "algorithm", "encoding", "prefix")

    header = "X-Signature"
    algorithm = "sha256"
    encoding = "hex"
    prefix = ""

    def validate(self):
        header = self.options.get("header", self.header)
        if not isinstance(header, str) or not header.strip() or any(c in header for c in " :\r\n"):
            raise VerifierConfigError("options.header", "must be a header name such as X-Signature")
        if self.options.get("algorithm", self.algorithm) not in ALGORITHMS:
            raise VerifierConfigError("options.algorithm", f"must be one of {', '.join(ALGORITHMS)}")
        if self.options.get("encoding", self.encoding) not in ENCODINGS:
            raise VerifierConfigError("options.encoding", f"must be one of {', '.join(ENCODINGS)}")
        if not isinstance(self.options.get("prefix", self.prefix), str):
            raise VerifierConfigError("options.prefix", "must be a string")

    def _setting(self, name: str) -> str:
        return self.options.get(name, getattr(self, name))

    def verify(self, headers, body, now):
        header = self._setting("header")
        value = Headers.of(headers).stripped(header)
        if not value:
            return f"missing {header} header"
        prefix = self._setting("prefix")
        if prefix and not value.startswith(prefix):
            return f"{header} does not start with {prefix!r}"
        given = _decode(value[len(prefix) :], self._setting("encoding"))
        if given is None:
            return f"{header} is not valid {self._setting('encoding')}"
        algorithm = self._setting("algorithm")
        expected = [_mac(algorithm, s.encode(), body) for s in self.secrets]
        return None if _matches([given], expected) else "signature does not match"

    def sign(self, body, now, *, secret=None, **extra):
        mac = _mac(self._setting("algorithm"), (secret or self.secrets[0]).encode(), body)
        encoded = mac.hex() if self._setting("encoding") == "hex" else base64.b64encode(mac).decode()
        return {self._setting("header"): self._setting("prefix") + encoded}


class GitHubVerifier(HmacHeaderVerifier):
    kind = "github"
    allowed_options = ()
    header = "X-Hub-Signature-256"
    prefix = "sha256="


class ShopifyVerifier(HmacHeaderVerifier):
    kind = "shopify"
    allowed_options = ()
    header = "X-Shopify-Hmac-Sha256"
    encoding = "base64"


class StripeVerifier(Verifier):
    """``Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">[,v1=...]``."""

    kind = "stripe"
    allowed_options = ("tolerance_s",)

    def validate(self):
        self._check_tolerance()

    def verify(self, headers, body, now):
        value = Headers.of(headers).stripped("Stripe-Signature")
        if not value:
            return "missing Stripe-Signature header"
        stamp_raw, given = None, []
        for part in value.split(","):
            key, _, item = part.strip().partition("=")
            if key == "t":
                stamp_raw = item
            elif key == "v1":
                decoded = _decode(item, "hex")
                if decoded is not None:
                    given.append(decoded)
        stamp, problem = _timestamp(stamp_raw, now, self.tolerance_s)
        if problem:
            return problem
        if not given:
            return "no v1 signature in Stripe-Signature"
        message = f"{stamp}.".encode() + body
        expected = [_mac("sha256", s.encode(), message) for s in self.secrets]
        return None if _matches(given, expected) else "signature does not match"

    def sign(self, body, now, *, secret=None, **extra):
        stamp = int(now)
        mac = _mac("sha256", (secret or self.secrets[0]).encode(), f"{stamp}.".encode() + body)
        return {"Stripe-Signature": f"t={stamp},v1={mac.hex()}"}


class StandardWebhooksVerifier(Verifier):
    """Standard Webhooks: HMAC-SHA256 of ``"id.timestamp.body"`` with the base64 ``whsec_`` secret."""

    kind = "standard"
    allowed_options = ("tolerance_s",)
    prefix = "webhook"

    def validate(self):
        self._check_tolerance()
        for index, secret in enumerate(self.secrets):
            if self._key(secret) is None:
                raise VerifierConfigError(
                    f"secrets[{index}]", "must be base64, optionally prefixed with whsec_"
                )

    @staticmethod
    def _key(secret: str) -> bytes | None:
        return _decode(secret.removeprefix("whsec_"), "base64")

    def verify(self, headers, body, now):
        view = Headers.of(headers)
        message_id = view.stripped(f"{self.prefix}-id")
        if not message_id:
            return f"missing {self.prefix}-id header"
        stamp, problem = _timestamp(view.stripped(f"{self.prefix}-timestamp"), now, self.tolerance_s)
        if problem:
            return problem
        signature = view.stripped(f"{self.prefix}-signature")
        if not signature:
            return f"missing {self.prefix}-signature header"
        given = []
        for entry in signature.split():
            version, _, value = entry.partition(",")
            decoded = _decode(value, "base64") if version == "v1" else None
            if decoded is not None:
                given.append(decoded)
        if not given:
            return f"no v1 signature in {self.prefix}-signature"
        message = f"{message_id}.{stamp}.".encode() + body
        expected = [_mac("sha256", self._key(s), message) for s in self.secrets]
        return None if _matches(given, expected) else "signature does not match"

    def sign(self, body, now, *, secret=None, message_id="msg_1", **extra):
        stamp = int(now)
        mac = _mac("sha256", self._key(secret or self.secrets[0]), f"{message_id}.{stamp}.".encode() + body)
        return {
            f"{self.prefix}-id": message_id,
            f"{self.prefix}-timestamp": str(stamp),
            f"{self.prefix}-signature": "v1," + base64.b64encode(mac).decode(),
        }


class SvixVerifier(StandardWebhooksVerifier):
    """Svix sends the Standard Webhooks scheme under ``svix-`` header names."""

    kind = "svix"
    prefix = "svix"


VERIFIERS: dict[str, type[Verifier]] = {
    cls.kind: cls
    for cls in (
        NoVerifier,
        GitHubVerifier,
        StripeVerifier,
        StandardWebhooksVerifier,
        SvixVerifier,
        ShopifyVerifier,
        HmacHeaderVerifier,
    )
}


# Schemes whose signature covers neither a timestamp nor the event id: sources verified by them
# dedupe on the body's digest unless staff say otherwise (``Source.dedupe_body``).
UNTIMESTAMPED = frozenset({"github", "shopify"})


def build_verifier(kind: str, secrets: Sequence[str] = (), options: Mapping | None = None) -> Verifier:
    """The verifier for a source's configuration; raises ``VerifierConfigError`` naming the field."""
    try:
        cls = VERIFIERS[kind]
    except (KeyError, TypeError):
        raise VerifierConfigError(
            "kind", f"unknown verifier {kind!r}; use one of {', '.join(VERIFIERS)}"
        ) from None
    return cls(secrets=secrets, options=options if options is not None else {})
