"""Connectors, sources, commands and their attempts.

* ``Connector``: where a tenant's commands go (an adapter kind and its configuration). Its
  credential (``secret``) is kept apart from the rest of the configuration and is never shown
  back: admin forms treat it as write-only. ``idempotent`` is a declaration by staff that two
  sends are one instruction; only an explicit true counts, and only then are failures retried.
* ``Source``: a named way commands arrive for a tenant (``POST /hooks/<tenant>/<source>/``),
  fanning out to one command per connector. Its signature verifier (``commands.signatures``) and
  dedupe key location (``commands.event_keys``) are checked when it is saved (:meth:`Source.clean`),
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
(:meth:`Connector.save`, ``commands.actions.reconsider``): its ``after-fix`` commands, and its
``not-idempotent`` ones once it is declared idempotent, are queued at once — the fix a person just
made should not wait out the 10-minute re-check period, nor the next round.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, URLValidator
from django.db import models, transaction
from django.db.models import F, Q
from django.db.models.expressions import RawSQL
from django.db.models.signals import m2m_changed
from django.dispatch import receiver
from django.utils import timezone

from commands import adapters, event_keys, signatures
from commands.adapters import egress
from commands.adapters.http import (
    HEADER_NAME,
    header_value_problem,
    longest_send_s,
    reserved_header_problem,
    url_carries_credentials,
    url_port_problem,
)
from commands.explain import URGENCY_SQL
from commands.retry import Outlook, SkipReason
from commands.states import State, next_state
from limits.models import TENANT_FIXED, FixedOnceCreated, Tenant, slug_validator

# Skip reasons that only a person's act can change (a resend, a fix, a new command). The sweep does
# not look at commands parked with one of them again, which keeps its query independent of the
# size of the failed list.
PARKED_REASONS = (
    SkipReason.NOT_DISPATCHABLE,
    SkipReason.NEVER,
    SkipReason.ATTEMPTS_SPENT,
    SkipReason.OUTLOOK_UNKNOWN,
    SkipReason.NOT_IDEMPOTENT,
)

HTTP_METHODS = [("POST", "POST"), ("PUT", "PUT"), ("PATCH", "PATCH")]


# Credentials belong in the write-only secret, never in headers an admin page shows back.
# A header whose name says it carries a credential: among the connector's headers, which everyone who
# may view it reads, it is refused; it goes in the write-only secret instead. Said by a part of the
# name (X-AuthToken, PrivateToken, X-Hasura-Admin-Secret, Cookie2), a word of it (X-Auth, X-JWT), or
# a key named for what it opens (DD-API-KEY, Ocp-Apim-Subscription-Key; not X-Routing-Key).
CREDENTIAL_PARTS = ("token", "secret", "passw", "credential", "apikey", "cookie", "authorization", "bearer")
CREDENTIAL_WORDS = frozenset({"auth", "pwd", "jwt"})
KEY_OF = frozenset(
    {"api", "access", "secret", "private", "subscription", "application", "app", "client", "master",
     "admin", "account", "license", "functions", "auth", "signing", "encryption"}
)  # fmt: skip
NOT_CREDENTIALS = frozenset({"idempotency-key"})  # the adapter sets it: the command's id


def is_credential_header(name: str) -> bool:
    lowered = name.lower()
    if lowered in NOT_CREDENTIALS:
        return False
    if any(part in lowered for part in CREDENTIAL_PARTS):
        return True
    words = re.split(r"[-_.]", lowered)
    return any(word in CREDENTIAL_WORDS for word in words) or any(
        word == "key" and before in KEY_OF for before, word in zip(words, words[1:], strict=False)
    )


# A header name is a token and a value one the HTTP adapter can send (``HEADER_NAME``,
# ``header_value_problem``): otherwise every send fails, with an error that would quote it.
def validate_header_name(value: str) -> None:
    if not HEADER_NAME.match(value):
        raise ValidationError(f"{value!r} is not a valid HTTP header name.")


def validate_headers(value) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValidationError('Headers must be a JSON object of strings: {"X-Team": "ops"}.')
    for name, header_value in value.items():
        validate_header_name(name)
        if problem := reserved_header_problem(name):
            raise ValidationError(f"{name} {problem}: a connector may not set it.")
        problem = header_value_problem(header_value)
        if problem is not None:
            raise ValidationError(f"The value of {name} {problem}.")
        if is_credential_header(name):
            raise ValidationError(
                f"{name} carries a credential: put it in the secret, which is never shown back."
            )


def destination_problem(url: str) -> str | None:
    """Why a connector may not send to ``url``'s host (``commands.adapters.egress``); None if it may,
    or if the URL is not one the other rules accept (they say so)."""
    try:
        parts = urlsplit(url or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return egress.host_problem(parts.hostname, port)


def validate_status_map(value) -> None:
    if not isinstance(value, dict):
        raise ValidationError('The status map must be a JSON object: {"409": "never"}.')
    for status, outlook in value.items():
        if not (isinstance(status, str) and status.isdigit() and 100 <= int(status) <= 599):
            raise ValidationError(f"{status!r} is not an HTTP status code (100-599).")
        if outlook not in Outlook.values:
            raise ValidationError(f"{outlook!r} is not an outlook; use one of {', '.join(Outlook.values)}.")


# A connector's pacing bounds: in flight at once (a thread each, until sends are asynchronous), and
# sends a second (one a minute to ten thousand).
MAX_IN_FLIGHT = 1000
MIN_PER_S = 1 / 60
MAX_PER_S = 10_000


class Connector(FixedOnceCreated, models.Model):
    fixed_fields = {"tenant": TENANT_FIXED}

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="connectors")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=32, choices=adapters.kind_choices)
    enabled = models.BooleanField(
        default=True, help_text="A disabled connector's commands wait as after-fix."
    )
    idempotent = models.BooleanField(
        default=False,
        help_text="Declare only when the receiver treats two sends of one command as one instruction "
        "(it dedupes on the Idempotency-Key header). Only then are failed commands retried.",
    )
    url = models.CharField(max_length=2000, blank=True, validators=[URLValidator(schemes=["http", "https"])])
    method = models.CharField(max_length=8, choices=HTTP_METHODS, default="POST")
    headers = models.JSONField(default=dict, blank=True, validators=[validate_headers])
    connect_timeout_s = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.01)], help_text="Empty: the site default."
    )
    read_timeout_s = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.01)], help_text="Empty: the site default."
    )
    status_map = models.JSONField(
        default=dict,
        blank=True,
        validators=[validate_status_map],
        help_text='HTTP status to outlook, overriding the defaults: {"409": "never"}.',
    )
    secret_header = models.CharField(
        max_length=100,
        blank=True,
        validators=[validate_header_name],
        help_text="The header that carries the credential, e.g. Authorization.",
    )
    secret = models.TextField(blank=True, help_text="The full header value. Never shown back.")
    # Pacing: how hard one dispatch process may press this receiver (commands.dispatch).
    max_in_flight = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_IN_FLIGHT)],
        help_text="Sends to this receiver in flight at once, per dispatch process. "
        "Empty: the site default (ANKUSA_DISPATCH_PER_CONNECTOR).",
    )
    max_per_s = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(MIN_PER_S), MaxValueValidator(MAX_PER_S)],
        help_text="At most this many sends a second to this receiver, per dispatch process. Empty: no limit.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="commands_connector_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"  # lists select the tenant with it

    def clean(self) -> None:
        # The secret and the URL are checked here rather than by field validators, which would need
        # a migration each. Neither message quotes the value: a form or an API error shows it back.
        errors: dict[str, str] = self.fixed_field_errors()
        problem = header_value_problem(self.secret) if self.secret else None
        if problem is not None:
            errors["secret"] = f"The secret {problem}."
        if url_carries_credentials(self.url):
            # The URL is shown back to anyone who may view the connector; the secret never is.
            errors["url"] = (
                "The URL must not carry credentials (user:password@): put them in the secret header "
                "and the secret instead, which are never shown back."
            )
        elif problem := url_port_problem(self.url):
            errors["url"] = f"{problem[0].upper()}{problem[1:]}."
        elif problem := destination_problem(self.url):
            errors["url"] = f"{problem[0].upper()}{problem[1:]}."
        if self.max_per_s is not None and not math.isfinite(self.max_per_s):
            errors["max_per_s"] = "The rate must be a number of sends a second."  # NaN passes the bounds
        if self.secret_header and (problem := reserved_header_problem(self.secret_header)):
            errors["secret_header"] = f"{self.secret_header} {problem}."
        elif self.secret_header and isinstance(self.headers, dict):
            lowered = self.secret_header.lower()
            if any(str(name).lower() == lowered for name in self.headers):
                errors["headers"] = f"{self.secret_header} carries the secret: it is not one of the headers."
        # Like system check E002 for the site defaults: a send must end before the recovery takes
        # it for abandoned, or its command is recorded as "unknown" while it is still going.
        longest = longest_send_s(self)
        if longest >= settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S:
            errors[NON_FIELD_ERRORS] = (
                f"Connect + read timeout ({longest:g} s) must stay under the queue's visibility "
                f"timeout ({settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S} s)."
            )
        if errors:
            raise ValidationError(errors)

    def save(self, *args, **kwargs) -> None:
        with transaction.atomic():
            super().save(*args, **kwargs)
            from commands.actions import reconsider  # above this module: it queues, through dispatch

            self.reconsidered = reconsider(self)


VERIFIER_LABELS = {
    "none": "none (anyone who knows the URL; private networks only)",
    "github": "GitHub (X-Hub-Signature-256)",
    "stripe": "Stripe (Stripe-Signature, 5-minute timestamp tolerance)",
    "standard": "Standard Webhooks (webhook-id / -timestamp / -signature)",
    "svix": "Svix (svix-id / -timestamp / -signature)",
    "shopify": "Shopify (X-Shopify-Hmac-Sha256)",
    "hmac": "generic HMAC header (options: header, algorithm, encoding, prefix)",
}
VERIFIER_CHOICES = [(kind, VERIFIER_LABELS[kind]) for kind in signatures.VERIFIERS]

# Which column a VerifierConfigError's field ("secrets[1]", "options.tolerance_s") is about. An
# unknown "kind" is not here: the verifier field's choices refuse it already.
VERIFIER_FIELDS = {"secrets": "verifier_secrets", "options": "verifier_options"}


class Source(FixedOnceCreated, models.Model):
    fixed_fields = {"tenant": TENANT_FIXED}

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="sources")
    slug = models.CharField(max_length=64, validators=[slug_validator])
    connectors = models.ManyToManyField(Connector, related_name="sources", blank=True)
    needs_approval = models.BooleanField(
        default=False, help_text="Its commands start as drafts that staff approve, instead of approved."
    )
    verifier = models.CharField(
        max_length=16,
        choices=VERIFIER_CHOICES,
        default="none",
        help_text="How a webhook proves it comes from the provider.",
    )
    verifier_secrets = models.JSONField(
        default=list,
        blank=True,
        help_text="The signing secrets, newest first; a signature made with any of them is accepted. "
        "Never shown back.",
    )
    verifier_options = models.JSONField(
        default=dict,
        blank=True,
        help_text='Options of the verifier: {"tolerance_s": 300} for Stripe / Standard Webhooks / Svix; '
        '{"header": "X-Signature", "algorithm": "sha256", "encoding": "hex", "prefix": ""} for hmac.',
    )
    dedupe_key = models.CharField(
        max_length=200,
        blank=True,
        help_text="Where the provider puts the event id, so a redelivery is a duplicate: a preset "
        f"({', '.join(event_keys.PRESETS)}), header:<Name>, json:<dotted.path>, or empty (no dedupe).",
    )
    dedupe_body = models.BooleanField(
        null=True,
        blank=True,
        default=None,
        help_text="Also refuse, as a duplicate, a body accepted before within the claim TTL (72 h), "
        "whatever its event id says: for providers that do not sign the id or a timestamp (GitHub, "
        "Shopify), so a captured webhook cannot be replayed under a new id. A provider that "
        "legitimately sends one body twice sees the second deduped. Empty: on for new GitHub and "
        "Shopify sources.",
    )

    class Meta:
        ordering = ["tenant", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="commands_source_unique_slug"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"  # lists select the tenant with it

    @property
    def initial_state(self) -> State:
        return State.DRAFT if self.needs_approval else State.APPROVED

    @property
    def dedupes_body(self) -> bool:
        """Whether a body accepted before is a duplicate (``dedupe_body``; unset: by verifier)."""
        if self.dedupe_body is None:
            return self.verifier in signatures.UNTIMESTAMPED
        return self.dedupe_body

    def save(self, *args, **kwargs) -> None:
        if self.dedupe_body is None:  # a new source's default, stored so a later change of verifier keeps it
            self.dedupe_body = self.dedupes_body
            if kwargs.get("update_fields") is not None:
                kwargs["update_fields"] = {*kwargs["update_fields"], "dedupe_body"}
        super().save(*args, **kwargs)

    def build_verifier(self) -> signatures.Verifier:
        """The verifier this source's configuration describes (raises ``VerifierConfigError``)."""
        return signatures.build_verifier(self.verifier, self.verifier_secrets, self.verifier_options)

    def clean(self) -> None:
        errors: dict[str, str] = self.fixed_field_errors()
        try:
            self.build_verifier()
        except signatures.VerifierConfigError as exc:
            column = VERIFIER_FIELDS.get(exc.field.split(".")[0].split("[")[0])
            if column is not None:
                errors[column] = str(exc)  # "secrets[1]: must be base64 ..." names the entry, never its value
        try:
            event_keys.resolve(self.dedupe_key)
        except event_keys.EventKeyConfigError as exc:
            errors["dedupe_key"] = exc.message
        if errors:
            raise ValidationError(errors)


OWN_CONNECTORS_ONLY = "A source fans out only to its own tenant's connectors."


@receiver(m2m_changed, sender=Source.connectors.through, dispatch_uid="commands.source_connectors_own_tenant")
def refuse_other_tenants_connectors(sender, instance, action, reverse, pk_set, **kwargs) -> None:
    """``source.connectors.add()``/``.set()`` (and ``connector.sources.add()``) link only rows of one
    tenant. A signal because a many-to-many add saves no model: this is the only hook every door
    (the admin's form, the API's serializer, the shell) passes through; the first two refuse it in
    their own validation before, with a field error."""
    if action != "pre_add" or not pk_set:
        return
    other = Connector if not reverse else Source
    if other.objects.filter(pk__in=pk_set).exclude(tenant_id=instance.tenant_id).exists():
        raise ValidationError({"connectors": OWN_CONNECTORS_ONLY})


# The request headers a delivery keeps: what tells staff which event it was. Signatures are left
# out (useless once verified), and so is everything else a provider or a proxy may add.
KEPT_HEADERS = (
    "Content-Type",
    "User-Agent",
    "X-GitHub-Event",
    "X-GitHub-Delivery",
    "X-GitHub-Hook-ID",
    "X-Shopify-Topic",
    "X-Shopify-Shop-Domain",
    "X-Shopify-Webhook-Id",
    "webhook-id",
    "webhook-timestamp",
    "svix-id",
    "svix-timestamp",
)
# A kept header value is cut here: it identifies an event, it is not data.
MAX_KEPT_HEADER_CHARS = 200


class Delivery(models.Model):
    """One webhook received and stored; ``commands`` are the ones made from it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="deliveries")
    source = models.ForeignKey(Source, on_delete=models.PROTECT, related_name="deliveries")
    event_key = models.CharField(
        max_length=255, blank=True, help_text="The provider's event id (empty: the source does not dedupe)."
    )
    headers = models.JSONField(default=dict, blank=True)
    body = models.TextField(blank=True)
    size = models.PositiveIntegerField(help_text="Body bytes.")
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "deliveries"
        constraints = [
            # The last guard against a duplicate: two nodes can never both store one event, whatever
            # the claim store answered. Partial, so deliveries of a source that does not dedupe
            # (empty key) never collide. The key leads, so the index also serves the lookup of the
            # stored original after a refused insert and the admin's search by event id.
            models.UniqueConstraint(
                fields=["event_key", "tenant", "source"],
                condition=~Q(event_key=""),
                name="commands_delivery_unique_event",
            ),
        ]

    def __str__(self) -> str:
        return f"delivery {self.pk} ({self.source.slug}: {self.event_key or 'no key'})"


class CommandQuerySet(models.QuerySet):
    def due(self, now: datetime):
        """Commands the sweep decides on: approved or failed, not parked, due by ``now``."""
        return self.filter(
            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
            state__in=[State.APPROVED, State.FAILED],
        ).exclude(skip_reason__in=PARKED_REASONS)

    def waiting_for_fix(self, connector: Connector):
        """``connector``'s failed commands whose adapter said a configuration fix is needed."""
        return self.filter(connector=connector, state=State.FAILED, last_outlook=Outlook.AFTER_FIX)

    def make_due(self, now: datetime) -> int:
        """Due at once: the next sweep decides again (clears the reason it was waiting for)."""
        return self.update(next_attempt_at=now, skip_reason="", skip_decided_at=None)

    def transition(self, state: str, event: str, now: datetime, **changes) -> int:
        """Move the commands of this queryset that are still in ``state`` by ``event``.

        One conditional UPDATE; returns how many moved, which the caller checks (``== 1`` for one
        command: 0 means another worker moved it first). ``changes`` are written with the move.
        """
        target = next_state(state, event)
        if target is None:
            raise ValueError(f"no transition from '{state}' on '{event}'")
        return self.filter(state=state).update(state=target, state_changed_at=now, **changes)


class Command(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="commands")
    connector = models.ForeignKey(Connector, on_delete=models.PROTECT, related_name="commands")
    source = models.ForeignKey(
        Source, on_delete=models.PROTECT, null=True, blank=True, related_name="commands"
    )
    idempotency_key = models.CharField(max_length=255, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.APPROVED)
    state_changed_at = models.DateTimeField(default=timezone.now)
    last_outlook = models.CharField(max_length=16, choices=Outlook.choices, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    skip_reason = models.CharField(max_length=32, choices=SkipReason.choices, blank=True)
    skip_decided_at = models.DateTimeField(null=True, blank=True)
    last_error_class = models.CharField(max_length=100, blank=True)
    last_error = models.TextField(blank=True)
    # The three person-made links below are empty on nearly every row: partial indexes (Meta) keep
    # them out of the index work of every insert.
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    resent_from = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="resent_as",
        db_index=False,
        help_text="The command this one was made from (make-a-new-command).",
    )
    resend_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
        help_text="Set while a person's resend waits for its send: the sweep takes it at its due time "
        "whatever the retry decision says, once; the send's outcome clears it.",
    )
    delivery = models.ForeignKey(
        Delivery, on_delete=models.PROTECT, null=True, blank=True, related_name="commands"
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = CommandQuerySet.as_manager()

    class Meta:
        permissions = [
            ("approve_command", "Can approve a draft command"),
            ("resend_command", "Can resend a failed command"),
            ("resend_override_command", "Can resend a non-idempotent or unknown-outcome command"),
            ("cancel_command", "Can cancel a command"),
        ]
        constraints = [
            # A REST client's Idempotency-Key: one command per key and tenant, whatever the claim
            # store said. Only for API submissions (no source): a webhook's fan-out gives several
            # commands the same key (its event key), one per connector, and the delivery's own
            # constraint guards those. Also serves the lookup of the original after a refused insert.
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(source__isnull=True) & ~Q(idempotency_key=""),
                name="commands_command_unique_api_key",
            ),
        ]
        indexes = [
            # The sweep: CommandQuerySet.due(now) — approved/failed and not parked, by due time.
            models.Index(
                fields=["next_attempt_at"],
                name="commands_due_idx",
                condition=Q(state__in=[State.APPROVED, State.FAILED]) & ~Q(skip_reason__in=PARKED_REASONS),
            ),
            # The failed list, filtered by skip reason, newest first.
            models.Index(
                fields=["skip_reason", "-id"], name="commands_failed_idx", condition=Q(state=State.FAILED)
            ),
            # The failed list's default order: what needs a person first, then oldest first
            # (commands.explain.urgency() — the same SQL text, which SQLite needs to use it).
            models.Index(
                RawSQL(URGENCY_SQL, []),
                F("id"),
                name="commands_failed_urgency_idx",
                condition=Q(state=State.FAILED),
            ),
            # The recovery: commands stuck in queued/dispatching, oldest state change first.
            models.Index(
                fields=["state_changed_at"],
                name="commands_in_flight_idx",
                condition=Q(state__in=[State.QUEUED, State.DISPATCHING]),
            ),
            # The person-made links, for a user's deletion and a copy's original: a handful of rows.
            models.Index(
                fields=["resend_by"], name="commands_resend_idx", condition=Q(resend_by__isnull=False)
            ),
            models.Index(
                fields=["approved_by"],
                name="commands_approved_by_idx",
                condition=Q(approved_by__isnull=False),
            ),
            models.Index(
                fields=["resent_from"],
                name="commands_resent_from_idx",
                condition=Q(resent_from__isnull=False),
            ),
            # A connector's after-fix commands, made due when the connector is saved.
            models.Index(
                fields=["connector", "last_outlook"],
                name="commands_connector_fix_idx",
                condition=Q(state=State.FAILED),
            ),
            # The connector list: each connector's failed commands (a capped count) and its latest
            # failure (last error and when), read newest first.
            models.Index(
                fields=["connector", "-state_changed_at"],
                name="commands_connector_failed_idx",
                condition=Q(state=State.FAILED),
            ),
            # The connector list: each connector's commands not sent yet (a capped count).
            models.Index(
                fields=["connector"],
                name="commands_connector_waiting_idx",
                condition=Q(state__in=[State.APPROVED, State.QUEUED]),
            ),
            # Connector health: each connector's failed commands by why they wait (capped counts,
            # commands.health_figures.waiting_annotations), one index range per reason, read from the index
            # alone (the resend link is in it: it decides between two reasons).
            models.Index(
                fields=["connector", "skip_reason", "last_outlook", "resend_by"],
                name="commands_connector_reason_idx",
                condition=Q(state=State.FAILED),
            ),
        ]

    def __str__(self) -> str:
        return f"command {self.pk} ({self.state})"

    def clean(self) -> None:
        if self.connector_id and self.tenant_id and self.connector.tenant_id != self.tenant_id:
            raise ValidationError({"connector": "The connector belongs to another tenant."})
        if self.source_id and self.tenant_id and self.source.tenant_id != self.tenant_id:
            raise ValidationError({"source": "The source belongs to another tenant."})


class Attempt(models.Model):
    command = models.ForeignKey(Command, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(null=True, help_text="Empty while in flight, or when the outcome is unknown.")
    outlook = models.CharField(max_length=16, choices=Outlook.choices, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error_class = models.CharField(max_length=100, blank=True)
    error_message = models.TextField(blank=True)
    response_excerpt = models.TextField(blank=True)
    manual = models.BooleanField(default=False, help_text="Started by a person (a resend), not the loop.")
    manual_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["command", "number"]
        constraints = [
            models.UniqueConstraint(fields=["command", "number"], name="commands_attempt_unique_number"),
        ]
        indexes = [
            # The dashboard's chart: attempts finished in the last 24 hours, by hour.
            models.Index(fields=["finished_at"], name="commands_attempt_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of command {self.command_id}"


class FailedCommand(Command):
    """The failed-command list of the admin: the same rows, a list of their own."""

    class Meta:
        proxy = True
        verbose_name = "failed command"


class AuditEntry(models.Model):
    """One staff action (admin or API): who, when, what, why, on which commands, and how it went."""

    class Action(models.TextChoices):
        APPROVE = "approve", "approve"
        RESEND = "resend", "resend"
        RESEND_OVERRIDE = "resend-override", "resend with override"
        CANCEL = "cancel", "cancel"
        NEW_COMMAND = "new-command", "make a new command"

    at = models.DateTimeField(default=timezone.now, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    username = models.CharField(max_length=150, help_text="Kept when the user is deleted.")
    action = models.CharField(max_length=20, choices=Action.choices)
    via = models.CharField(max_length=8, choices=[("admin", "admin"), ("api", "API")])
    reason = models.TextField(blank=True)
    count = models.PositiveIntegerField(help_text="Commands the action was asked for.")
    done = models.PositiveIntegerField(help_text="Commands it changed.")
    result = models.JSONField(default=dict, blank=True, help_text="What happened to the others, by reason.")
    commands = models.ManyToManyField(Command, related_name="audit_entries", blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.action} by {self.username} at {self.at:%Y-%m-%d %H:%M:%S}"


class DispatcherHeartbeat(models.Model):
    """One dispatch process (a ``manage.py dispatch`` loop or a Celery worker process) and the last
    round it ran: written by ``commands.heartbeat.beat``, read by the dashboard."""

    class Kind(models.TextChoices):
        LOOP = "loop", "dispatch loop"
        CELERY = "celery", "Celery worker"

    name = models.CharField(max_length=200, unique=True, help_text="host:pid of the process.")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    started_at = models.DateTimeField(help_text="Its first round.")
    last_round_at = models.DateTimeField(db_index=True)
    rounds = models.PositiveBigIntegerField(default=1)

    class Meta:
        ordering = ["-last_round_at"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.name}"


# The connector health summary's tables (commands.health): their own module, registered here.
from commands.health_models import ConnectorHealth, HealthBucket  # noqa: E402, F401
