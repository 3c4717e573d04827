"""Adapters: how a command leaves Ankusa, one module per connector kind.

A kind is one module in this package that defines ``ADAPTER`` (an object with ``kind``,
``label``, ``check(connector)`` and ``send(command)``); the registry finds it by itself, so adding
a kind touches nothing else. ``Connector.kind`` takes its choices from here.

Every dispatch goes through :func:`send`, which adds what no adapter should have to repeat:

* a connector with a configuration problem (disabled, no URL, a missing credential) is not sent
  at all, and the outcome is ``after-fix`` — a person fixes it, and the next round sends it;
* an adapter that raises is a failure with **no** outlook: our own bug happened somewhere between
  "about to send" and "sent", so nobody knows whether it went out, and unknown means no retry.

What this does not guarantee: an ``ok`` outcome means the receiver answered success, not that it
acted; a failure may still have been acted on (a read timeout after the receiver took it) — that
is why only connectors that declared idempotency are ever retried.
"""

from __future__ import annotations

import functools
import importlib
import logging
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from commands.retry import Outlook

if TYPE_CHECKING:
    from commands.models import Command, Connector

logger = logging.getLogger("ankusa.commands.adapters")

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
    connector = command.connector
    found = problems(connector)
    if found:
        return Outcome(
            ok=False, outlook=Outlook.AFTER_FIX, detail="; ".join(found), error_class="Configuration"
        )
    try:
        return registry()[connector.kind].send(command)
    except Exception as exc:  # an adapter bug: whether it went out is unknown
        logger.exception("adapter %s raised for command %s", connector.kind, command.pk)
        return Outcome(
            ok=False, outlook=None, detail=str(exc)[:EXCERPT_CHARS], error_class=type(exc).__name__
        )
