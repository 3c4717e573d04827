"""The REST doors of a connector's pause and outage hold: ``POST /api/v1/connectors/{id}/pause/``
(``reason`` required) and ``/resume/``, each one call of ``commands.staff.pausing``, and the connector's
``sending`` state (sending, paused, held) in its representation. Refusals: 400 for the request
(no reason), 409 for the connector's state (paused already, not paused), 403 without
``commands.pause_connector`` (operators and admins)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from ankusa_site.core.api import Conflict, StrictSerializer, errors
from commands.models import Connector
from commands.staff import pausing
from commands.staff.actions import MAX_REASON, Refused

PERMISSIONS = {"pause": (pausing.PERMISSION,), "resume": (pausing.PERMISSION,)}
CONFLICTS = {"already_paused", "not_paused"}


def sending(connector: Connector) -> dict:
    """Whether the connector sends now, and if not why and since when (the API's ``sending``)."""
    if connector.paused_at is not None:
        return {"state": "paused", "since": connector.paused_at, "reason": connector.pause_reason}
    if connector.held_since is not None:
        return {"state": "held", "since": connector.held_since, "next_probe": connector.probe_at,
                "probes": connector.probes}  # fmt: skip
    return {"state": "sending", "again_in_a_row": connector.outage_failures}


# Whether a connector's commands go out now (named in the schema: ``SendingStateEnum``).
SENDING_STATES = ("sending", "paused", "held")

SENDING = inline_serializer(
    "ConnectorSending",
    {
        "state": serializers.ChoiceField(choices=SENDING_STATES),
        "since": serializers.DateTimeField(required=False),
        "reason": serializers.CharField(required=False),
        "next_probe": serializers.DateTimeField(required=False),
        "probes": serializers.IntegerField(required=False),
        "again_in_a_row": serializers.IntegerField(required=False),
    },
)


class Text(serializers.CharField):
    """A JSON string: a number or a list is no reason (DRF's ``CharField`` would take ``5`` as "5")."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class PauseInput(StrictSerializer):
    reason = Text(max_length=MAX_REASON, help_text="Why nothing should be sent to it.")


class ResumeInput(StrictSerializer):
    reason = Text(max_length=MAX_REASON, required=False, allow_blank=True)


ANSWER = inline_serializer("ConnectorPaused", {"connector": serializers.IntegerField(),
                           "sending": SENDING, "audit": serializers.IntegerField()})  # fmt: skip


class Refusal(exceptions.APIException):
    status_code = 400
    default_code = "refused"


class PauseActions:
    """Mixed into the connector viewset: its two actions."""

    def _act(self, request, act, input_class):
        connector = self.get_object()
        data = input_class(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            entry = act(connector, user=request.user, via="api", reason=data.validated_data.get("reason", ""))
        except Refused as refused:
            exc = (Conflict if refused.code in CONFLICTS else Refusal)(refused.detail)
            exc.default_code = refused.code  # the "error" a client reads: "already_paused"
            raise exc from None
        connector.refresh_from_db()
        return Response({"connector": connector.pk, "sending": sending(connector), "audit": entry.pk})

    @extend_schema(request=PauseInput, responses={200: ANSWER, **errors(400, 401, 403, 404, 409)},
                   description="Pause the connector: nothing is sent to it, no attempt is spent.")  # fmt: skip
    @action(detail=True, methods=["post"], url_path="pause")
    def pause(self, request, pk=None):
        return self._act(request, pausing.pause, PauseInput)

    @extend_schema(request=ResumeInput, responses={200: ANSWER, **errors(400, 401, 403, 404, 409)},
                   description="Resume the connector: its waiting commands go at the resend rate.")  # fmt: skip
    @action(detail=True, methods=["post"], url_path="resume")
    def resume(self, request, pk=None):
        return self._act(request, pausing.resume, ResumeInput)
