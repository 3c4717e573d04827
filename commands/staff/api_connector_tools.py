"""REST endpoints of ``commands.staff.connector_tools``, beside the connector's own (``/api/v1/connectors/``):

* ``POST /connectors/{id}/test/`` — a test send now; 200 with the answer (status, outlook, time,
  excerpt), 429 with ``Retry-After`` within a second of the last one;
* ``GET /connectors/{id}/signing-secrets/`` — the secrets by id, hint and date (never the secret);
* ``POST /connectors/{id}/signing-secrets/`` — a new secret: 201, the only answer that holds it;
* ``DELETE /connectors/{id}/signing-secrets/{key}/`` — drop one: 204.

Rows are scoped like the connector endpoints (another tenant's connector is a 404). Reading needs
``view_connector`` (tenant tokens read their own); everything else operator and up
(``change_connector``), never a tenant token. A body, where one is taken, must be empty or ``{}``.
"""

from __future__ import annotations

import math

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import SAFE_METHODS
from rest_framework.response import Response

from ankusa_site.core.api import StrictSerializer, errors
from commands.models import Connector
from commands.staff import connector_tools
from commands.staff.api_base import Scoped

KEY_PATTERN = r"[0-9a-f]{8}"


class NoInput(StrictSerializer):
    """An empty body or ``{}``: these endpoints take nothing (any field is a 400)."""


KEY_FIELDS: dict[str, serializers.Field] = {
    "id": serializers.CharField(),
    "hint": serializers.CharField(),
    "added_at": serializers.DateTimeField(),
}
KEYS = inline_serializer("SigningKey", KEY_FIELDS, many=True)
NEW_KEY = inline_serializer(
    "NewSigningKey",
    {
        **KEY_FIELDS,
        "secret": serializers.CharField(help_text="whsec_…: shown in this answer only, never again."),
    },
)
TEST_ANSWER = inline_serializer(
    "TestAnswer",
    {
        "test_id": serializers.CharField(),
        "ok": serializers.BooleanField(),
        "outlook": serializers.ChoiceField(choices=["ok", "again", "after-fix", "never", "unknown"]),
        "status": serializers.IntegerField(allow_null=True),
        "ms": serializers.FloatField(),
        "excerpt": serializers.CharField(),
        "detail": serializers.CharField(),
        "error_class": serializers.CharField(),
        "signed": serializers.BooleanField(),
    },
)


class TooSoon(exceptions.APIException):
    """429: DRF's own answer (``Throttled``) for a test asked for too soon; its ``wait`` is the
    ``Retry-After``."""

    status_code = 429
    default_code = "too_soon"

    def __init__(self, detail: str, wait: int):
        super().__init__(detail)
        self.wait = wait


class ConnectorToolsViewSet(Scoped, viewsets.GenericViewSet):
    permission_model = "commands.connector"
    tenant_reads = True
    queryset = Connector.objects.none()  # the schema's; get_queryset answers

    def get_queryset(self):
        return self.scoped(Connector.objects.select_related("tenant"))

    def required_permissions(self, request) -> tuple[str, ...]:
        if request.method in SAFE_METHODS:
            return ("commands.view_connector",)
        return (connector_tools.PERMISSION,)

    def _no_input(self, request) -> None:
        if request.data in (None, ""):  # no body at all
            return
        NoInput(data=request.data).is_valid(raise_exception=True)

    @extend_schema(
        request=None,
        responses={200: TEST_ANSWER, **errors(400, 401, 403, 404, 429)},
        description="Send a marked test payload to the connector now, outside any command (no "
        "command, attempt or queue item), signed like a real send; answers how the receiver "
        "answered. At most one a second per connector (429 with Retry-After).",
    )
    @action(detail=True, methods=["post"], url_path="test")
    def send_test(self, request, pk=None):
        connector = self.get_object()
        self._no_input(request)
        try:
            answer = connector_tools.send_test(connector, by=request.user, via="the API")
        except connector_tools.TooSoon as refused:
            raise TooSoon(str(refused), wait=math.ceil(refused.retry_after_s)) from None
        return Response(
            {
                "test_id": answer.test_id,
                "ok": answer.ok,
                "outlook": answer.outlook,
                "status": answer.status,
                "ms": answer.ms,
                "excerpt": answer.excerpt,
                "detail": answer.detail,
                "error_class": answer.error_class,
                "signed": answer.signed,
            }
        )

    @extend_schema(
        methods=["GET"],
        responses={200: KEYS, **errors(400, 401, 403, 404)},
        description="The connector's signing secrets, by id, hint and date: never the secret.",
    )
    @extend_schema(
        methods=["POST"],
        request=None,
        responses={201: NEW_KEY, **errors(400, 401, 403, 404)},
        description="Make a new signing secret (Standard Webhooks, whsec_…). This answer is the only "
        "one that holds it. Every kept secret signs: drop the old one once the receiver has the new.",
    )
    @action(
        detail=True,
        methods=["get", "post"],
        url_path="signing-secrets",
        filter_backends=[],
        pagination_class=None,
    )
    def signing_secrets(self, request, pk=None):
        connector = self.get_object()
        if request.method == "GET":
            return Response(connector_tools.signing_keys(connector))
        self._no_input(request)
        try:
            secret, shown = connector_tools.add_signing_secret(connector, by=request.user, via="the API")
        except DjangoValidationError as exc:
            raise exceptions.ValidationError(exc.message_dict) from None
        return Response({**shown, "secret": secret}, status=status.HTTP_201_CREATED)

    @extend_schema(
        request=None,
        responses={204: None, **errors(401, 403, 404)},
        description="Drop one signing secret: sends stop carrying its signature at once.",
    )
    @action(detail=True, methods=["delete"], url_path=f"signing-secrets/(?P<key_id>{KEY_PATTERN})")
    def drop_signing_secret(self, request, pk=None, key_id=None):
        connector = self.get_object()
        try:
            connector_tools.drop_signing_secret(connector, key_id, by=request.user, via="the API")
        except connector_tools.UnknownSecret as exc:
            raise exceptions.NotFound(str(exc)) from None
        return Response(status=status.HTTP_204_NO_CONTENT)
