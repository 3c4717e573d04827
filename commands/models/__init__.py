"""Connectors, sources, commands and their attempts.

* ``Connector``: where a tenant's commands go (an adapter kind and its configuration). Its
  credential (``secret``) is kept apart from the rest of the configuration and is never shown
  back: admin forms treat it as write-only. ``idempotent`` is a declaration by staff that two
  sends are one instruction; only an explicit true counts, and only then are failures retried.
  Its Standard Webhooks signing secrets (``signing_secrets``) are never edited through a form: only
  ``commands.staff.connector_tools`` adds and drops them, and only a hint of each is ever shown.
* ``Source``: a named way commands arrive for a tenant (``POST /hooks/<tenant>/<source>/``),
  fanning out to one command per connector. Its signature verifier (``commands.intake.signatures``) and
  dedupe key location (``commands.intake.event_keys``) are checked when it is saved (:meth:`Source.clean`),
  so a bad configuration fails in the admin rather than on the first webhook. Its secrets are a
  list (rotation: add the new one, remove the old once the provider signs with it) and are
  write-only everywhere they are edited.
* ``Delivery``: one webhook received and stored, and the commands made from it. Its unique
  constraint on ``(tenant, source, event_key)`` is the last guard against a duplicate, whatever the
  claim store said (a Redis outage, a claim that expired).
* ``Command``: one instruction for one connector. A REST submission's ``Idempotency-Key`` is unique
  per tenant among the commands that came through the API (no source); a webhook's commands carry
  the delivery's event key, shared by the commands of one fan-out. Its ``state`` moves only along
  ``commands.states`` through :meth:`CommandQuerySet.transition`, a conditional update whose row
  count is checked, so racing workers cannot both make the same move. The retry decision's inputs
  (``last_outlook``, ``attempts``, ``next_attempt_at``) and its latest answer (``skip_reason``)
  live on the row, so every list can show why a command is waiting.
* ``Attempt``: one dispatch of one command, written once and complete when the send ends (or by
  the recovery, for a send whose worker died); the dispatch loop never rewrites or deletes one.

Saving a connector decides again on its waiting commands in the same transaction
(:meth:`Connector.save`, ``commands.staff.reconsider``): its ``after-fix`` commands, and its
``not-idempotent`` ones once it is declared idempotent, are queued at once — the fix a person just
made should not wait out the 10-minute re-check period, nor the next round.

One module per table; every name is imported here, where Django and the callers look for it.
"""

from commands.models.attempt import Attempt
from commands.models.audit import AuditEntry
from commands.models.command import PARKED_REASONS, Command, CommandQuerySet, FailedCommand
from commands.models.connector import (
    CREDENTIAL_PARTS,
    CREDENTIAL_WORDS,
    HTTP_METHODS,
    KEY_OF,
    MAX_IN_FLIGHT,
    MAX_PER_S,
    MIN_PER_S,
    NOT_CREDENTIALS,
    Connector,
    destination_problem,
    is_credential_header,
    validate_header_name,
    validate_headers,
    validate_status_map,
)
from commands.models.delivery import KEPT_HEADERS, MAX_KEPT_HEADER_CHARS, Delivery
from commands.models.heartbeat import DispatcherHeartbeat
from commands.models.source import (
    OWN_CONNECTORS_ONLY,
    VERIFIER_CHOICES,
    VERIFIER_FIELDS,
    VERIFIER_LABELS,
    Source,
    refuse_other_tenants_connectors,
)

__all__ = [
    "Attempt",
    "AuditEntry",
    "CREDENTIAL_PARTS",
    "CREDENTIAL_WORDS",
    "Command",
    "CommandQuerySet",
    "Connector",
    "Delivery",
    "DispatcherHeartbeat",
    "FailedCommand",
    "HTTP_METHODS",
    "KEPT_HEADERS",
    "KEY_OF",
    "MAX_IN_FLIGHT",
    "MAX_KEPT_HEADER_CHARS",
    "MAX_PER_S",
    "MIN_PER_S",
    "NOT_CREDENTIALS",
    "OWN_CONNECTORS_ONLY",
    "PARKED_REASONS",
    "Source",
    "VERIFIER_CHOICES",
    "VERIFIER_FIELDS",
    "VERIFIER_LABELS",
    "destination_problem",
    "is_credential_header",
    "refuse_other_tenants_connectors",
    "validate_header_name",
    "validate_headers",
    "validate_status_map",
]
from commands.models.health import ConnectorHealth, HealthBucket  # noqa: E402, F401
