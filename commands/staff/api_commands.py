"""The REST command viewset (``/api/v1/commands/``): list, read, and the staff actions (approve,
resend, cancel, new command, one or in bulk) through ``commands.staff.actions``, which holds the
guards, the compare-and-set and the audit row; a dry run answers the plan without acting.
``POST /commands/`` is ``commands.intake.rest.submit`` unchanged (quota, dedupe, queue).
"""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
)
from rest_framework import exceptions, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from ankusa_site.core.api import (
    Conflict,
    errors,
    paging_params,
    refuse_unknown_query_params,
)
from commands.intake import rest as intake_api
from commands.models import Command
from commands.staff import actions
from commands.staff.api_base import READ_ERRORS, NewestFirst, Scoped, readable_schema
from commands.staff.api_command_io import (
    ACTION_ANSWER,
    ActionInput,
    AttemptCursor,
    AttemptSerializer,
    BulkInput,
    CommandDetailSerializer,
    CommandFilter,
    CommandSerializer,
    NewCommandInput,
)


def action_schema(request, description: str, operation_id: str):
    return extend_schema(
        operation_id=operation_id,
        request=request,
        responses={200: ACTION_ANSWER, **errors(400, 401, 403, 404, 409)},
        description=description,
    )


def run_action(name: str, queryset, request, data: dict) -> Response:
    """Plan or perform one staff action (``commands.staff.actions``) and answer its dict."""
    user, override = request.user, data["override"]
    try:
        if data["dry_run"]:
            answer = actions.plan(name, queryset, override=override, user=user)
        else:
            answer = actions.perform(
                name, queryset, user=user, via="api", reason=data["reason"], override=override
            )
    except actions.Refused as refused:
        raise refusal(refused) from None
    return Response(answer.as_dict())


# Refusals about the state of the commands (409: none would change); every other one is about the
# request (400).
CONFLICTS = {"not_failed", "nothing_to_do"}


class RequestRefused(exceptions.APIException):
    status_code = 400
    default_code = "refused"


def refusal(refused: actions.Refused) -> exceptions.APIException:
    exc = (Conflict if refused.code in CONFLICTS else RequestRefused)(refused.detail)
    exc.default_code = refused.code  # the "error" a client reads: "reason_required", "not_failed"
    return exc


def _action_permissions() -> dict[str, tuple[str, ...]]:
    table: dict[str, tuple[str, ...]] = {"create": ()}  # submit() decides: tenant token, or add_command
    for name in actions.ACTIONS:
        table[f"{name}_one"] = table[f"{name}_many"] = (actions.PERMISSIONS[name],)
    table["new_command"] = (actions.PERMISSIONS["new-command"],)
    table["attempts"] = ("commands.view_command", "commands.view_attempt")
    return table


# The views that answer a command's detail (its payload and its resent copies).
DETAIL_ACTIONS = ("retrieve", "new_command")


# Actions that look a command up only to know it exists for the caller (then act on its id).
FOUND_ONLY_ACTIONS = ("approve_one", "resend_one", "cancel_one", "attempts")


@readable_schema(CommandSerializer, CommandDetailSerializer)
class CommandViewSet(Scoped, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    pagination_class = NewestFirst
    filterset_class = CommandFilter
    permission_model = "commands.command"
    action_permissions = _action_permissions()
    tenant_actions = ("create",)

    def get_queryset(self):
        if self.action in FOUND_ONLY_ACTIONS:  # the row only has to be there, in the caller's scope
            return self.scoped(Command.objects.only("id", "tenant_id"))
        commands = Command.objects.select_related("tenant", "connector", "source")
        if self.action in DETAIL_ACTIONS:
            commands = commands.prefetch_related(
                Prefetch("resent_as", queryset=Command.objects.only("id", "resent_from_id"))
            )
        else:
            commands = commands.defer("payload")  # lists and actions never show it
        return self.scoped(commands)

    def get_serializer_class(self):
        return CommandDetailSerializer if self.action in DETAIL_ACTIONS else CommandSerializer

    @extend_schema(
        operation_id="commands_submit",
        request=intake_api.CommandInput,
        parameters=[
            OpenApiParameter(
                "Idempotency-Key",
                location=OpenApiParameter.HEADER,
                required=False,
                description="One command per key and tenant; a repeat answers 200 with the original.",
            )
        ],
        responses={
            202: intake_api.COMMAND_ANSWER,
            200: intake_api.COMMAND_ANSWER,
            **errors(400, 401, 403, 409, 410, 413, 415, 422, 429, 503),
        },
    )
    def create(self, request):
        return intake_api.submit(request)

    def one(self, name: str, request) -> Response:
        command = self.get_object()
        data = self.input(ActionInput, request)
        return run_action(name, Command.objects.filter(pk=command.pk), request, data)

    def many(self, name: str, request) -> Response:
        data = self.input(BulkInput, request)
        if "ids" in data:
            commands = Command.objects.filter(pk__in=data["ids"])
        else:
            commands = CommandFilter(data=data["filter"], queryset=Command.objects.all()).qs
        return run_action(name, commands, request, data)

    def input(self, serializer_class, request) -> dict:
        serializer = serializer_class(data=request.data)
        serializer.is_valid(raise_exception=True)
        return serializer.validated_data

    @action_schema(ActionInput, "Approve one draft command (dry_run: the plan only).", "commands_approve_one")
    @action(detail=True, methods=["post"], url_path="approve")
    def approve_one(self, request, pk=None):
        return self.one("approve", request)

    @action_schema(
        ActionInput,
        "Resend one failed command (a compare-and-set; override with a reason).",
        "commands_resend_one",
    )
    @action(detail=True, methods=["post"], url_path="resend")
    def resend_one(self, request, pk=None):
        return self.one("resend", request)

    @action_schema(ActionInput, "Cancel one draft, approved or failed command.", "commands_cancel_one")
    @action(detail=True, methods=["post"], url_path="cancel")
    def cancel_one(self, request, pk=None):
        return self.one("cancel", request)

    @action_schema(
        BulkInput, "Approve the commands named by ids or matching filter.", "commands_approve_many"
    )
    @action(detail=False, methods=["post"], url_path="approve")
    def approve_many(self, request):
        return self.many("approve", request)

    @action_schema(BulkInput, "Resend the commands named by ids or matching filter.", "commands_resend_many")
    @action(detail=False, methods=["post"], url_path="resend")
    def resend_many(self, request):
        return self.many("resend", request)

    @action_schema(BulkInput, "Cancel the commands named by ids or matching filter.", "commands_cancel_many")
    @action(detail=False, methods=["post"], url_path="cancel")
    def cancel_many(self, request):
        return self.many("cancel", request)

    @extend_schema(
        request=NewCommandInput,
        responses={201: CommandDetailSerializer, **errors(400, 401, 403, 404, 409)},
        description="A new command made from a failed one (payload editable), linked to it.",
    )
    @action(detail=True, methods=["post"], url_path="new-command")
    def new_command(self, request, pk=None):
        original = self.get_object()
        data = self.input(NewCommandInput, request)
        try:
            command = actions.new_command(
                original, user=request.user, via="api", payload=data.get("payload"), reason=data["reason"]
            )
        except actions.Refused as refused:
            raise refusal(refused) from None
        command = self.get_queryset().get(pk=command.pk)
        return Response(self.get_serializer(command).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: AttemptSerializer(many=True), **READ_ERRORS}, filters=False)
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=AttemptCursor)
    def attempts(self, request, pk=None):
        """The command's whole attempt history, newest first, in cursor pages."""
        refuse_unknown_query_params(request, paging_params(self.paginator))
        page = self.paginate_queryset(self.get_object().attempt_set.all())
        return self.get_paginated_response(AttemptSerializer(page, many=True).data)
