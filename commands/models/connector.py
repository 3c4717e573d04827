"""``Connector``: where a tenant's commands go (an adapter kind and its configuration), and the
rules its configuration obeys (headers, URL, status map, pacing). See ``commands.models``.
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

from commands.dispatch import adapters
from commands.dispatch.adapters import egress
from commands.dispatch.adapters.http import (
    HEADER_NAME,
    header_value_problem,
    longest_send_s,
    reserved_header_problem,
    url_carries_credentials,
    url_port_problem,
)
from commands.retry import Outlook
from limits.models import TENANT_FIXED, FixedOnceCreated, Tenant

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
    """Why a connector may not send to ``url``'s host (``commands.dispatch.adapters.egress``); None if it may,
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
MAX_HOLD_AFTER = 1_000_000
# What the pause actions, the dispatch loop and the connector tools (signing secrets, test sends)
# write on a connector, never a form's save.
RUNTIME_FIELDS = frozenset(
    {"paused_at", "paused_by", "pause_reason", "held_since", "probe_at", "probes", "outage_failures",
     "outage_since", "signing_secrets", "tested_at"}
)  # fmt: skip


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
    # Pacing: how hard one dispatch process may press this receiver (commands.dispatch.senders).
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
    # Standard Webhooks signing (commands.signing): a list on the row rather than a table of its
    # own, because the dispatcher loads connectors in bulk and a send must not cost a query more; a
    # handful of entries, each {"id": "<8 hex>", "secret": "whsec_…", "added_at": iso}, all signing. Not
    # editable: written only by commands.staff.connector_tools (add, drop), never through a form.
    signing_secrets = models.JSONField(default=list, blank=True, editable=False)
    # The last console test send (commands.staff.connector_tools): its compare-and-set paces them.
    tested_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Pause and outage hold (commands.dispatch.hold, commands.staff.pausing): while either is set, none of its
    # commands is sent and none spends an attempt.
    hold_after_failures = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MaxValueValidator(MAX_HOLD_AFTER)],
        help_text="Hold the connector after this many `again` failures in a row (0: never hold). "
        "Empty: the site default (ANKUSA_HOLD_AFTER_FAILURES).",
    )
    paused_at = models.DateTimeField(null=True, blank=True, editable=False)
    paused_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        editable=False,
    )
    pause_reason = models.TextField(blank=True, editable=False)
    held_since = models.DateTimeField(null=True, blank=True, editable=False)
    probe_at = models.DateTimeField(null=True, blank=True, editable=False)
    probes = models.PositiveIntegerField(default=0, editable=False)
    outage_failures = models.PositiveIntegerField(default=0, editable=False)
    outage_since = models.DateTimeField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "name"]
        permissions = [("pause_connector", "Can pause and resume a connector")]
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

    @property
    def stopped_since(self) -> datetime | None:
        """Since when none of its commands is sent (paused or held); None while it sends."""
        return self.paused_at or self.held_since

    def save(self, *args, **kwargs) -> None:
        if self.pk is not None and not self._state.adding and kwargs.get("update_fields") is None:
            # A person's edit never writes the pause and hold fields: the dispatch loop and the pause
            # actions change them meanwhile, by conditional updates a stale form must not undo.
            kwargs["update_fields"] = [
                f.name
                for f in self._meta.concrete_fields
                if not f.primary_key and f.name not in RUNTIME_FIELDS
            ]
        # One transaction with the decisions its post_save receiver takes again on its commands
        # (commands.staff.reconsider, connected by CommandsConfig.ready), which sets
        # ``self.reconsidered``.
        with transaction.atomic():
            super().save(*args, **kwargs)
