"""``POST /api/v1/commands/``: a REST client submits one command, under the same quota and dedupe as
a webhook (``commands.intake.submit.submit``).

Body: ``{"connector": <id or name>, "payload": {...}}`` (JSON, ``Content-Type: application/json``),
optional header ``Idempotency-Key``. Answers:

* 202 ``{"status": "accepted", "id", "connector", "state", "created_at"}`` — stored, and queued
  for dispatch (a REST command starts approved);
* 200 ``{"status": "duplicate", ...}`` — the same fields of the command first stored with this
  ``Idempotency-Key``; 422 ``idempotency_key_reused`` when that command has another connector or
  payload (the key names one request, not a slot to overwrite);
* 400 / 401 / 403 / 409 / 410 / 413 / 415 / 429 / 503 as JSON ``{"error", "detail"}`` (410: the
  command first stored with this key was deleted since).

Who may submit for which tenant:

* a **tenant token** submits to its own tenant's connectors only; a connector of another tenant
  is answered exactly like one that does not exist (400), so ids reveal nothing. It may name its
  own tenant in ``"tenant"``; naming another is 403;
* a **staff user** (token or session) holding ``commands.add_command`` submits on behalf of the
  tenant it names in ``"tenant"`` (required), charged to that tenant's quota;
* anyone else is 403.

``submit(request)`` is self-contained: ``commands.staff.api_commands.CommandViewSet.create`` (the POST of
``/api/v1/commands/``) calls it and declares its schema. The body is read and parsed here, not by DRF's parsers, so
the size limit applies before reading and hostile JSON is a 400, never a 500.
"""

from __future__ import annotations

import logging

from django.conf import settings
from drf_spectacular.utils import (
    extend_schema_field,
    inline_serializer,
)
from rest_framework import exceptions, serializers
from rest_framework.response import Response

from ankusa_site.core.answers import answer_unreachable
from ankusa_site.core.api import StrictSerializer, json_errors
from ankusa_site.core.logs import log_event
from ankusa_site.core.strict_json import Refusal, parse_json
from commands.intake import event_keys
from commands.intake import submit as intake
from commands.intake.arrival import Accepted, Arrival, Stored
from commands.intake.http import measured, read_body, refusal
from commands.models import Command, Connector
from limits.authentication import tenant_of
from limits.models import Tenant
from limits.quotas import max_body_bytes

logger = logging.getLogger("ankusa.intake")

STAFF_PERMISSION = "commands.add_command"
# Database ids are 64-bit: a larger number is no connector, and must not reach the database.
MAX_ID = 2**63 - 1


@extend_schema_field({"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "maxLength": 100}]})
class ConnectorRef(serializers.Field):
    """A connector by id (a number) or by name (a string), resolved within the tenant later."""

    default_error_messages = {"invalid": "Give the connector's id (a number) or its name (a string)."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | str):
            self.fail("invalid")
        if not (1 <= data <= MAX_ID if isinstance(data, int) else 0 < len(data) <= 100):
            self.fail("invalid")
        return data

    def to_representation(self, value):
        return value


class CommandInput(StrictSerializer):
    connector = ConnectorRef()
    payload = serializers.DictField()
    tenant = serializers.CharField(required=False, max_length=64)


COMMAND_ANSWER = inline_serializer(
    "CommandAnswer",
    {
        "status": serializers.ChoiceField(choices=["accepted", "duplicate"]),
        "id": serializers.IntegerField(),
        "connector": serializers.IntegerField(),
        "state": serializers.CharField(),
        "created_at": serializers.DateTimeField(),
    },
)


def summary(command: Command | Stored, status: str) -> dict:
    return {
        "status": status,
        "id": command.pk,
        "connector": command.connector_id,
        "state": command.state,
        "created_at": command.created_at,
    }


def _answer(refusal: Refusal, tenant: Tenant | None = None) -> Response:
    log_event(
        logger,
        "api_refused",
        tenant=tenant.slug if tenant else "",
        status=refusal.status,
        reason=refusal.code,
    )
    return Response(refusal.data, status=refusal.status, headers=refusal.headers)


def _submitting_tenant(request, named: str | None) -> Tenant | Refusal:
    own = tenant_of(request.user)
    if own is not None:
        if named not in (None, own.slug):
            return Refusal(403, "permission_denied", "A tenant token submits only for its own tenant.")
        return own
    if not (request.user.is_staff and request.user.has_perm(STAFF_PERMISSION)):
        return Refusal(
            403, "permission_denied", f"Submitting needs a tenant token, or staff with {STAFF_PERMISSION}."
        )
    if named is None:
        return Refusal(400, "invalid", "tenant: Staff name the tenant they submit for.")
    tenant = Tenant.objects.filter(slug=named, active=True).first()
    if tenant is None:
        return Refusal(400, "invalid", "tenant: No such active tenant.")
    return tenant


@measured("api")
@answer_unreachable(wrote=False)  # the tenant's and connector's reads: 503, and counted
def submit(request) -> Response:
    """Admit, store and queue one command from a REST request (DRF ``Request``, authenticated)."""
    content_type = request.content_type.split(";")[0].strip().lower()
    if content_type != "application/json":
        return _answer(Refusal(415, "unsupported_media_type", "Send Content-Type: application/json."))
    own = tenant_of(request.user)
    # Staff name their tenant inside the body: until it is read, the site's request cap applies.
    limit = max_body_bytes(own) if own else settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    body = read_body(request._request, limit, endpoint="api")
    if isinstance(body, Refusal):
        return _answer(body, own)
    parsed = parse_json(body)
    if isinstance(parsed, Refusal):
        return _answer(parsed, own)
    data = CommandInput(data=parsed[0])
    if not data.is_valid():
        # The site's shape for validation errors (with "fields"), answered here so it is counted.
        return json_errors(exceptions.ValidationError(data.errors), {})
    tenant = _submitting_tenant(request, data.validated_data.get("tenant"))
    if isinstance(tenant, Refusal):
        return _answer(tenant, own)
    if len(body) > max_body_bytes(tenant):
        return _answer(
            Refusal(413, "too_large", f"The body is larger than {max_body_bytes(tenant)} bytes."),
            tenant,
        )

    ref = data.validated_data["connector"]
    connector = Connector.objects.filter(
        tenant=tenant, **({"pk": ref} if isinstance(ref, int) else {"name": ref})
    )
    connector = connector.values_list("id", "idempotent").first()
    if connector is None:
        return _answer(Refusal(400, "invalid", f"connector: No connector {ref!r} for this tenant."), tenant)
    key = request.headers.get("Idempotency-Key", "").strip()
    payload = data.validated_data["payload"]
    outcome = intake.submit(
        Arrival(
            tenant=tenant,
            connectors=[connector],
            payload=payload,
            size=len(body),
            dedupe_key=event_keys.normalise(key) if key else None,
        )
    )
    refused = refusal(outcome)
    if refused is not None:
        return _answer(refused, tenant)
    if isinstance(outcome, Accepted):
        command = outcome.commands[0]
        log_event(logger, "api_accepted", tenant=tenant.slug, command=command.pk, size=len(body))
        return Response(summary(command, "accepted"), status=202, headers=outcome.headers)
    original = Command.objects.filter(tenant=tenant, pk=outcome.id).first()
    if original is None:
        return _answer(Refusal(410, "gone", "The command first stored with this key was deleted."), tenant)
    if original.connector_id != connector[0] or not same_document(original.payload, payload):
        return _answer(
            Refusal(
                422,
                "idempotency_key_reused",
                "This Idempotency-Key was used for another request (another connector or payload).",
            ),
            tenant,
        )
    log_event(logger, "api_duplicate", tenant=tenant.slug, command=original.pk)
    return Response(summary(original, "duplicate"), status=200, headers=outcome.headers)


def same_document(stored, sent) -> bool:
    """Whether two JSON documents are the same, value for value and kind for kind: Python's ``==``
    takes ``true`` for ``1``, which made a changed payload a duplicate. Numbers are compared by
    value, whole or not: PostgreSQL's jsonb gives ``1e16`` back as ``10000000000000000``."""
    if _kind(stored) is not _kind(sent):
        return False
    if isinstance(stored, dict):
        return stored.keys() == sent.keys() and all(same_document(stored[k], sent[k]) for k in stored)
    if isinstance(stored, list):
        return len(stored) == len(sent) and all(map(same_document, stored, sent))
    return stored == sent


def _kind(value) -> type:
    return float if isinstance(value, int | float) and not isinstance(value, bool) else type(value)
