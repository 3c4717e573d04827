"""What staff do to one connector besides editing it: rotate its signing secrets, send it a test.
The admin (``admin_connector_tools``) and the API (``api_connector_tools``) only collect the
choice and show the answer; the rules live here, so every door obeys them.

* **Signing secrets** (``commands.signing``): :func:`add_signing_secret` makes a new one and
  returns it in full — the only time it is ever shown; :func:`drop_signing_secret` removes one by
  its id. All that are kept sign every send, so a rotation is: add the new one, give it to the
  receiver, drop the old one once the receiver uses the new one. Only an http connector signs; at
  most ``signing.MAX_SECRETS`` at once. Each change takes the connector's row lock (two people
  adding at once keep both), is written with an update that leaves ``Connector.save`` out (nothing
  waiting is decided again: a signature does not make a send possible or impossible), and is
  audited like an edit in the admin (a line in the connector's history, naming the secret by id
  and hint) and logged (by id only).
* **A test send** (:func:`send_test`): a marked payload goes out now through the connector's own
  adapter (``commands.dispatch.adapters.send``: the same egress guard, credential, signature, outlook
  mapping and masking of the answer as a real send), outside any command — no ``Command``, no
  ``Attempt``, no queue item. One per connector per ``TEST_INTERVAL_S``, claimed by a compare-and-
  set on ``Connector.tested_at`` (every process and both databases agree), so the button is no
  cannon; a refused one raises :class:`TooSoon`.

Who may: operator and up (``commands.change_connector``), checked here as well as at the door.
Not guaranteed: on SQLite two concurrent rotations may lose one (no row lock there); a test send's
answer says how the receiver answered the test, not how it will answer a command.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from ankusa_site.core.logs import log_event
from commands import signing
from commands.dispatch import adapters
from commands.models import Connector

logger = logging.getLogger("ankusa.commands.connector_tools")

PERMISSION = "commands.change_connector"
# One test send per connector a second: enough to try a fix again and again by hand, too few to
# flood a receiver from the console.
TEST_INTERVAL_S = 1.0
# What a test's answer shows of the receiver's body: a glance, not the body (the excerpt is
# already masked of the connector's secret by commands.dispatch.adapters).
TEST_EXCERPT_CHARS = 300


class TooSoon(Exception):  # noqa: N818 - it names the refusal
    """A test send asked for within ``TEST_INTERVAL_S`` of the last one of that connector."""

    def __init__(self, retry_after_s: float):
        super().__init__(f"One test send a second per connector: try again in {retry_after_s:.1f} s.")
        self.retry_after_s = retry_after_s


class UnknownSecret(LookupError):
    """No signing secret of the connector has that id (dropped already, or never made)."""


def check_permission(user) -> None:
    if not getattr(user, "pk", None) or not user.has_perm(PERMISSION):
        raise PermissionDenied("You may not change this connector.")


def record_history(user, connector: Connector, message: str, *, via: str) -> None:
    """A line in the connector's admin history, as the admin writes for its own edits."""
    if getattr(user, "pk", None) is None:
        return
    LogEntry.objects.log_actions(
        user.pk, [connector], CHANGE, change_message=f"{message} (via {via})", single_object=True
    )


# --- signing secrets ------------------------------------------------------------------------------


def signing_keys(connector: Connector) -> list[dict[str, str]]:
    """What may be shown of ``connector``'s signing secrets: id, hint and when each was added."""
    return [
        {"id": entry["id"], "hint": signing.hint(entry["secret"]), "added_at": entry["added_at"]}
        for entry in connector.signing_secrets or ()
    ]


def _store(connector: Connector, entries: list[dict], now: datetime) -> None:
    # An update, not save(): Connector.save decides again on waiting commands, which a signing
    # secret does not concern; updated_at moves all the same, since the configuration changed.
    Connector.objects.filter(pk=connector.pk).update(signing_secrets=entries, updated_at=now)
    connector.signing_secrets, connector.updated_at = entries, now


def add_signing_secret(
    connector: Connector, *, by, via: str = "admin", now: datetime | None = None
) -> tuple[str, dict[str, str]]:
    """Make a new signing secret for ``connector``; returns it in full (show it once, never keep
    it) and what may be shown of it afterwards. Raises ``ValidationError`` (not http, too many)."""
    check_permission(by)
    now = now or timezone.now()
    with transaction.atomic():
        locked = Connector.objects.select_for_update().get(pk=connector.pk)
        if locked.kind != "http":
            raise ValidationError({"signing_secrets": "Only an http connector signs what it sends."})
        entries = list(locked.signing_secrets or ())
        if len(entries) >= signing.MAX_SECRETS:
            raise ValidationError(
                {
                    "signing_secrets": f"A connector holds at most {signing.MAX_SECRETS} signing "
                    "secrets: drop an old one first."
                }
            )
        secret = signing.new_secret()
        taken = {entry["id"] for entry in entries}
        key_id = secrets.token_hex(4)
        while key_id in taken:
            key_id = secrets.token_hex(4)
        entries.append({"id": key_id, "secret": secret, "added_at": now.isoformat()})
        _store(connector, entries, now)
        shown = signing_keys(connector)[-1]
        record_history(by, connector, f"Added signing secret {key_id} ({shown['hint']})", via=via)
    log_event(
        logger, "signing_secret_added", connector=connector.pk, key=key_id, by=by.get_username(), via=via
    )
    return secret, shown


def drop_signing_secret(
    connector: Connector, key_id: str, *, by, via: str = "admin", now: datetime | None = None
) -> dict[str, str]:
    """Remove ``connector``'s signing secret ``key_id``: sends stop carrying its signature at once.
    Returns what was shown of it; raises :class:`UnknownSecret`."""
    check_permission(by)
    now = now or timezone.now()
    with transaction.atomic():
        locked = Connector.objects.select_for_update().get(pk=connector.pk)
        entries = list(locked.signing_secrets or ())
        kept = [entry for entry in entries if entry["id"] != key_id]
        if len(kept) == len(entries):
            raise UnknownSecret(f"The connector has no signing secret {key_id}.")
        [dropped] = [
            {"id": entry["id"], "hint": signing.hint(entry["secret"]), "added_at": entry["added_at"]}
            for entry in entries
            if entry["id"] == key_id
        ]
        _store(connector, kept, now)
        left = f"{len(kept)} left" if kept else "it no longer signs"
        record_history(by, connector, f"Dropped signing secret {key_id} ({dropped['hint']}); {left}", via=via)
    log_event(
        logger, "signing_secret_dropped", connector=connector.pk, key=key_id, by=by.get_username(), via=via
    )
    return dropped


# --- a test send ----------------------------------------------------------------------------------


@dataclass
class TestSend:
    """Stands in for a ``Command`` in ``commands.dispatch.adapters.send``: what an adapter reads of one."""

    __test__ = False  # not a pytest class, whatever its name

    connector: Connector
    payload: dict[str, Any]
    pk: str = field(default_factory=lambda: secrets.token_hex(8))
    is_test: bool = True  # commands.signing marks it, and gives it a test_ webhook-id

    @property
    def tenant_id(self) -> int:
        return self.connector.tenant_id


@dataclass(frozen=True)
class TestAnswer:
    """How the receiver answered a test send."""

    __test__ = False

    test_id: str
    ok: bool
    outlook: str  # "ok", or the failure's outlook as the dispatcher would judge it, or "unknown"
    status: int | None
    ms: float
    excerpt: str
    detail: str
    error_class: str
    signed: bool

    def summary(self) -> str:
        answer = f"HTTP {self.status}" if self.status is not None else (self.detail or "no answer")
        return f"{answer}, outlook {self.outlook}, in {self.ms:.0f} ms"


def _claim_test_slot(connector: Connector, now: datetime) -> None:
    interval = timedelta(seconds=TEST_INTERVAL_S)
    free = Q(tested_at__isnull=True) | Q(tested_at__lte=now - interval)
    if Connector.objects.filter(pk=connector.pk).filter(free).update(tested_at=now):
        return
    last = Connector.objects.filter(pk=connector.pk).values_list("tested_at", flat=True).first()
    # A racing request may have read its clock before ours and claimed after: then ``last`` is
    # later than ``now``, and the wait is at most one interval all the same.
    waited = max((now - last).total_seconds(), 0.0) if last else 0.0
    raise TooSoon(min(max(TEST_INTERVAL_S - waited, 0.1), TEST_INTERVAL_S))


def send_test(
    connector: Connector,
    *,
    by,
    via: str = "admin",
    now: datetime | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> TestAnswer:
    """Send a marked test payload to ``connector`` now and say how it answered (raises
    :class:`TooSoon`, ``PermissionDenied``). ``clock`` times the send (tests move it)."""
    check_permission(by)
    now = now or timezone.now()
    _claim_test_slot(connector, now)
    stand_in = TestSend(
        connector=connector,
        payload={
            "test": True,
            "connector": connector.name,
            "tenant": connector.tenant.slug,
            "sent_at": now.isoformat(),
        },
    )
    started = clock()
    outcome = adapters.send(stand_in)  # type: ignore[arg-type] # a Command's stand-in
    ms = round((clock() - started) * 1000, 1)
    if outcome.ok:
        outlook = "ok"
    else:
        outlook = outcome.outlook.value if outcome.outlook else "unknown"
    answer = TestAnswer(
        test_id=f"test_{stand_in.pk}",
        ok=outcome.ok,
        outlook=outlook,
        status=outcome.status,
        ms=ms,
        excerpt=outcome.excerpt[:TEST_EXCERPT_CHARS],
        detail=outcome.detail,
        error_class=outcome.error_class,
        signed=connector.kind == "http" and bool(connector.signing_secrets),
    )
    record_history(by, connector, f"Sent a test: {answer.summary()}", via=via)
    log_event(
        logger,
        "connector_tested",
        connector=connector.pk,
        test=answer.test_id,
        status=answer.status,
        outlook=answer.outlook,
        ms=ms,
        by=by.get_username(),
        via=via,
    )
    return answer
