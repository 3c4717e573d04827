"""Adapters: how a command leaves Ankusa, one module per connector kind.

A kind is one module in this package that defines ``ADAPTER`` (an object with ``kind``,
``label``, ``check(connector)`` and ``send(command)``); the registry finds it by itself, so adding
a kind touches nothing else. ``Connector.kind`` takes its choices from here.

Every dispatch goes through :func:`send` (or :func:`send_async`, the same on the send loop, which
awaits an adapter's ``send_async`` when it has one), which adds what no adapter should have to repeat:

* a connector with a configuration problem (disabled, no URL, a missing credential) is not sent
  at all, and the outcome is ``after-fix`` — a person fixes it, and the next round sends it;
* an adapter that raises is a failure with **no** outlook: our own bug happened somewhere between
  "about to send" and "sent", so nobody knows whether it went out, and unknown means no retry;
* that failure's message is withheld, from the outcome (which the tenant reads as ``last_error``)
  and from the logged traceback (its frames are kept), when it quotes the connector's secret or a
  header value that cannot be sent, in any of the forms Python prints a string or its bytes, and
  whenever it is a ``UnicodeError`` (whose message quotes the character it could not encode).
  Withholding is a second line: the adapters name a bad header without quoting it themselves. It
  cannot see a secret quoted in part, or in a form other than those;
* the receiver's answer (the outcome's excerpt and detail, shown to staff and the tenant on the
  attempt) has the connector's secret masked: a receiver that echoes the request's headers would
  otherwise show it back. Masked are the secret and its credential alone (``Bearer <this>``), as
  is, as Python prints it, JSON-escaped as the common encoders do it (Go's, .NET's, PHP's),
  percent-encoded or HTML-escaped, and the start of one where an excerpt was cut. Not seen: a
  secret in another case, split across the answer, or encoded otherwise (base64);
* what PostgreSQL cannot store (a NUL, a lone surrogate) in the answer or a raised message is
  replaced by U+FFFD: an outcome that no database write takes would never be recorded.

What this does not guarantee: an ``ok`` outcome means the receiver answered success, not that it
acted; a failure may still have been acted on (a read timeout after the receiver took it) — that
is why only connectors that declared idempotency are ever retried.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import importlib
import json
import logging
import pkgutil
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol
from urllib.parse import quote, quote_plus

from ankusa_site.core.strict_json import storable
from commands.retry import Outlook

if TYPE_CHECKING:
    from commands.models import Command, Connector

logger = logging.getLogger("ankusa.commands.adapters")

# What an outcome's detail says instead of a message that may quote a credential.
WITHHELD = "{} (message withheld: it may quote the connector's secret or a header value)"

# An attempt keeps this much of the receiver's answer: enough to read an error message, bounded so
# a receiver answering megabytes cannot grow the attempts table.
EXCERPT_CHARS = 1000


@dataclass(frozen=True)
class Outcome:
    ok: bool
    outlook: Outlook | None = None
    status: int | None = None
    detail: str = ""
    error_class: str = ""
    excerpt: str = ""


class Adapter(Protocol):
    kind: str
    label: str

    def check(self, connector: Connector) -> list[str]:
        """Problems that make sending pointless until a person fixes the connector (empty: none)."""

    def send(self, command: Command) -> Outcome:
        """Deliver ``command`` once and say how it went. Never retries by itself."""


@functools.cache
def registry() -> dict[str, Adapter]:
    adapters: dict[str, Adapter] = {}
    for module_info in pkgutil.iter_modules(__path__):
        adapter = getattr(importlib.import_module(f"{__name__}.{module_info.name}"), "ADAPTER", None)
        if adapter is not None:
            adapters[adapter.kind] = adapter
    return adapters


def kind_choices() -> list[tuple[str, str]]:
    """``Connector.kind`` choices; a callable, so a new kind needs no migration."""
    return sorted((kind, adapter.label) for kind, adapter in registry().items())


def problems(connector: Connector) -> list[str]:
    """Everything that stops ``connector`` from sending, the adapter's own checks included."""
    adapter = registry().get(connector.kind)
    if adapter is None:
        return [f"unknown connector kind {connector.kind!r}"]
    found = [] if connector.enabled else ["the connector is disabled"]
    return found + adapter.check(connector)


def send(command: Command) -> Outcome:
    """Send ``command`` through its connector's adapter, or say why it was not sent."""
    refused = _refusal(command.connector)
    if refused is not None:
        return refused
    try:
        outcome = registry()[command.connector.kind].send(command)
    except Exception as exc:  # an adapter bug: whether it went out is unknown
        return _raised(command, exc)
    return _shown(outcome, command.connector)


async def send_async(command: Command) -> Outcome:
    """:func:`send` as a coroutine on the send loop (``commands.dispatch.event_loop``): an adapter with a
    ``send_async`` is awaited; one without (the log adapter: no I/O to wait for) is called.

    The connector's problems are looked for once per connector object (the dispatcher reads its
    connectors afresh for every drain): the check parses the URL and judges a literal address,
    CPU a thousand sends in flight would otherwise spend per send. A name is still checked at
    every connection (``http_async.CheckedResolver``)."""
    refused = _refusal(command.connector, once=True)
    if refused is not None:
        return refused
    adapter = registry()[command.connector.kind]
    try:
        sending = getattr(adapter, "send_async", None)
        outcome = await sending(command) if sending is not None else adapter.send(command)
    except Exception as exc:  # an adapter bug: whether it went out is unknown
        return _raised(command, exc)
    return _shown(outcome, command.connector)


# Where send_async keeps a connector object's problems (see there).
_PROBLEMS = "_send_problems"


def _refusal(connector: Connector, *, once: bool = False) -> Outcome | None:
    found = connector.__dict__.get(_PROBLEMS) if once else None
    if found is None:
        found = problems(connector)
        if once:
            connector.__dict__[_PROBLEMS] = found
    if not found:
        return None
    return Outcome(ok=False, outlook=Outlook.AFTER_FIX, detail="; ".join(found), error_class="Configuration")


def _raised(command: Command, exc: Exception) -> Outcome:
    connector = command.connector
    name = type(exc).__name__
    if _may_quote_a_credential(exc, connector):
        detail = WITHHELD.format(name)
        # The traceback's frames, under a stand-in that carries no message and no chain.
        exc_info = (MessageWithheld, MessageWithheld(detail), exc.__traceback__)
    else:
        detail, exc_info = str(exc), (type(exc), exc, exc.__traceback__)
    logger.error("adapter %s raised for command %s", connector.kind, command.pk, exc_info=exc_info)
    return Outcome(ok=False, outlook=None, detail=storable(detail[:EXCERPT_CHARS]), error_class=name)


def _shown(outcome: Outcome, connector: Connector) -> Outcome:
    """``outcome`` with the connector's secret masked in what the receiver answered, and what the
    database cannot store replaced (a NUL in an answer would fail every write of the outcome)."""
    excerpt, detail = storable(outcome.excerpt), storable(outcome.detail)
    if connector.secret:
        forms = _secret_forms(connector.secret)
        excerpt, detail = masked(excerpt, forms), masked(detail, forms)
    if (excerpt, detail) == (outcome.excerpt, outcome.detail):
        return outcome
    return dataclasses.replace(outcome, excerpt=excerpt, detail=detail)


MASK = "[redacted]"
# A shorter secret, or part of one, is not looked for: three characters would mask common words.
MIN_MASKED_CHARS = 4


# What common JSON encoders escape that Python's does not: Go's <, > and & (lower-case hex), .NET's
# System.Text.Json also + ' and ` (upper-case hex); PHP writes / as \/.
_ESCAPES = (("<>&", "\\u{:04x}"), ("<>&+'`", "\\u{:04X}"), ("/", "\\{}"))


@functools.lru_cache(maxsize=256)
def _secret_forms(secret: str) -> list[str]:
    """The texts that show ``secret`` in a receiver's answer, longest first: the secret and the
    credential after its scheme (``Bearer``, ``Basic``, ...), each as :func:`_quoted_forms` gives
    it, JSON-escaped as the common encoders do it, percent-encoded and HTML-escaped."""
    values = {secret, secret.split()[-1] if secret.split() else secret}
    forms = set()
    for value in values:
        as_json = json.dumps(value)[1:-1]
        forms |= _quoted_forms(value) | {
            as_json,
            quote(value, safe=""),
            quote_plus(value),
            html.escape(value),
        }
        for escaped, escape in _ESCAPES:
            forms.add(
                "".join(escape.format(ord(c) if "u" in escape else c) if c in escaped else c for c in as_json)
            )
    return sorted((form for form in forms if len(form) >= MIN_MASKED_CHARS), key=len, reverse=True)


def masked(text: str, forms: list[str]) -> str:
    """``text`` with each of ``forms`` replaced by ``[redacted]``; and, if ``text`` is as long as an
    excerpt or a detail is cut to, a tail that begins one (cut inside a secret) as well."""
    for form in forms:
        text = text.replace(form, MASK)
    if len(text.encode("utf-8", "surrogatepass")) < EXCERPT_CHARS - 3:  # whole: nothing was cut
        return text
    for form in forms:
        for size in range(len(form) - 1, MIN_MASKED_CHARS - 1, -1):
            if text.endswith(form[:size]):
                return text[:-size] + MASK
    return text


class MessageWithheld(Exception):  # noqa: N818 - it names what the log line shows, not an error of its own
    """Logged in place of an adapter's exception whose message may quote a credential."""


def _quoted_forms(value: str) -> set[str]:
    """``value`` as an error message may print it: as is, as a str's or its bytes' repr."""
    forms = {value, repr(value)[1:-1], ascii(value)[1:-1]}
    for encoding in ("latin-1", "utf-8"):
        forms.add(repr(value.encode(encoding, "backslashreplace"))[2:-1])
    return {form for form in forms if form}


def _may_quote_a_credential(exc: BaseException, connector: Connector) -> bool:
    """Whether ``exc`` or an exception in its chain may quote the secret or a header value that
    cannot be sent (the values an error about a header quotes). Header values that can be sent are
    not secret: staff and the tenant read them on the connector."""
    values = [connector.secret] if connector.secret else []
    values += [
        str(value)
        for value in (connector.headers or {}).values()
        if header_value_problem(str(value)) is not None
    ]
    forms = set().union(*(_quoted_forms(value) for value in values))
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, UnicodeError):
            return True
        text = str(link)
        if any(form in text for form in forms):
            return True
        link = link.__cause__ or link.__context__
    return False


# What a header value may hold (RFC 9110 §5.5): visible ASCII, space, tab, and the visible rest of
# Latin-1 (obs-text; http.client encodes values as Latin-1). Not DEL or the C1 controls
# (0x7f-0x9f): no credential holds one, and a receiver may take one for the end of the header.
# Here rather than in ``http`` (which uses it for the headers it sends): the redaction below needs
# it too, and ``http`` imports this package.
_NOT_IN_HEADER_VALUE = re.compile(r"[^\t\x20-\x7e\xa0-\xff]")


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as a header value, in words that never quote it; None if it can."""
    found = _NOT_IN_HEADER_VALUE.search(value)
    if found is None:
        return None
    if found.group() in "\r\n":
        return "must be on one line (no CR or LF)"
    if ord(found.group()) > 0xFF:
        return "may hold only Latin-1 characters"
    return "must not hold control characters"
