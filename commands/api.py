"""REST endpoints of the commands app: sources, connectors, commands and their staff actions,
deliveries and audit entries (mounted under ``/api/v1/`` by ``commands.api_urls``).

Who may do what is ``limits.permissions.ApiPermission``: staff by their Django permissions (the
viewer / operator / admin groups of ``commands.staff_groups``), tenant tokens read their own
tenant's rows only (another tenant's row is a 404, exactly like a missing one) and submit
commands; they never run a staff action, never read audit entries.

* Credentials are write-only: a connector's ``secret`` and a source's ``verifier_secrets`` are
  accepted on write and never returned; ``secret_set`` / ``secrets_set`` say whether (how many).
  A delivery never shows a signature header (the intake keeps none; the filter here is a second
  guard).
* ``POST /commands/`` is ``commands.intake_api.submit`` unchanged (quota, dedupe, queue).
* The staff actions (``approve``, ``resend``, ``cancel`` on one command or in bulk, and
  ``new-command``) parse their input, check the action's permission and call one function of
  ``commands.actions``, which holds the guards, the compare-and-set and the audit row; a dry run
  answers its plan and writes nothing.
* Big lists (commands, deliveries, attempts, audit) are cursor pages: no COUNT over the table,
  and the cost of a page does not grow with the table (see the query-count test).
* Ids are 64-bit: a path or filter id past 2**63-1 is a 404 or a 400 before it reaches the database.
"""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import Prefetch, ProtectedError
from drf_spectacular.utils import (
    OpenApiParameter,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.reverse import reverse

from ankusa_site.core.api import (
    Access,
    Conflict,
    Cursor,
    StrictFilterSet,
    StrictModelSerializer,
    StrictSerializer,
    clean_model,
    errors,
    paging_params,
    refuse_unknown_query_params,
)
from commands import actions, intake_api
from commands.explain import (
    AFTER_FIX,
    MACHINE,
    NO_REASON,
    NOBODY,
    PERSON,
    RESEND_PENDING,
    explain,
    waiting_for,
)
from commands.models import Attempt, AuditEntry, Command, Connector, Delivery, Source
from commands.retry import Outlook, SkipReason
from commands.states import State
from limits.authentication import tenant_of
from limits.models import Tenant

MAX_ID = intake_api.MAX_ID
# A bulk action by ids names at most this many; more is a filter's job.
MAX_BULK_IDS = 10_000
ID_PATTERN = r"[0-9]{1,19}"
# Header names a delivery never shows, whatever was stored: signatures prove, they do not inform.
SIGNATURE_MARKERS = ("signature", "hmac", "authorization", "token", "secret")


READ_ERRORS = errors(400, 401, 403, 404)
WRITE_ERRORS = errors(400, 401, 403, 404, 409)


class IdCursor(Cursor):
    ordering = "id"


class NewestFirst(Cursor):
    ordering = "-id"


class IdFilter(django_filters.NumberFilter):
    """An id: a whole number from 1 to 2**63-1 (anything else is a 400, never a database error)."""

    field_class = forms.IntegerField

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", MAX_ID)
        super().__init__(*args, **kwargs)


class IdLookup(Access):
    """A view whose rows are found by a numeric id in the URL: past the largest id, a 404 like any
    missing row (never a database error)."""

    lookup_value_regex = ID_PATTERN

    def get_object(self):
        if int(self.kwargs[self.lookup_field]) > MAX_ID:
            model = self.get_queryset().model
            raise exceptions.NotFound(f"No {model._meta.object_name} matches the given query.")
        return super().get_object()


class Scoped(IdLookup):
    """A view over one model whose rows belong to a tenant: a tenant token sees its own only."""

    tenant_reads = True

    def scoped(self, queryset):
        own = tenant_of(self.request.user)
        return queryset if own is None else queryset.filter(tenant=own)


class Editable(Scoped, viewsets.ModelViewSet):
    """A tenant's read-write rows (connectors, sources), in id order. A row other rows still point
    at (commands of a connector, deliveries of a source) is not deleted: a 409."""

    pagination_class = IdCursor

    def perform_destroy(self, instance):
        try:
            instance.delete()
        except ProtectedError as exc:
            raise Conflict(
                f"Still in use by {len(exc.protected_objects)} or more rows; disable it instead."
            ) from None


class TenantFilterSet(StrictFilterSet):
    """Filters of a tenant's rows, starting with the tenant by slug."""

    tenant = django_filters.CharFilter(field_name="tenant__slug", max_length=64)


class TenantField(serializers.SlugRelatedField):
    """The owning tenant by slug: given once on create (staff), fixed afterwards."""

    def __init__(self, **kwargs):
        super().__init__(slug_field="slug", queryset=Tenant.objects.all(), **kwargs)


class Owned(StrictModelSerializer):
    tenant = TenantField()

    def validate_tenant(self, tenant: Tenant) -> Tenant:
        if self.instance is not None and tenant.pk != self.instance.tenant_id:
            raise serializers.ValidationError("The tenant of an existing row does not change.")
        return tenant


# --- connectors ---------------------------------------------------------------------------------


class SourceFilter(TenantFilterSet):
    class Meta:
        model = Source
        fields = ["tenant"]


class ConnectorFilter(TenantFilterSet):
    class Meta:
        model = Connector
        fields = ["tenant", "kind", "enabled"]


class ConnectorSerializer(Owned):
    secret = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        max_length=10_000,
        trim_whitespace=False,
        help_text="The full credential header value. Write-only: never returned.",
    )
    secret_set = serializers.SerializerMethodField()
    headers = serializers.JSONField(required=False)
    status_map = serializers.JSONField(required=False)

    class Meta:
        model = Connector
        fields = [
            "id", "tenant", "name", "kind", "enabled", "idempotent", "url", "method", "headers",
            "connect_timeout_s", "read_timeout_s", "status_map", "secret_header", "secret", "secret_set",
            "max_in_flight", "max_per_s", "updated_at",
        ]  # fmt: skip
        extra_kwargs = {
            "connect_timeout_s": {"max_value": 3600},
            "read_timeout_s": {"max_value": 3600},
        }

    def get_secret_set(self, connector: Connector) -> bool:
        return bool(connector.secret)

    def validate(self, attrs: dict) -> dict:
        clean_model(self.instance or Connector(), attrs)
        return attrs


def _read_answers(serializer, detail) -> dict:
    return {
        "list": extend_schema(responses={200: serializer(many=True), **READ_ERRORS}),
        "retrieve": extend_schema(responses={200: detail, **READ_ERRORS}),
    }


def readable_schema(serializer, detail):
    """The answers of a read-only viewset: a list of ``serializer``, one row as ``detail``."""
    return extend_schema_view(**_read_answers(serializer, detail))


def editable_schema(serializer):
    """The answers of a read-write viewset over ``serializer``'s model, for the OpenAPI schema."""
    return extend_schema_view(
        **_read_answers(serializer, serializer),
        create=extend_schema(responses={201: serializer, **WRITE_ERRORS}),
        update=extend_schema(responses={200: serializer, **WRITE_ERRORS}),
        partial_update=extend_schema(responses={200: serializer, **WRITE_ERRORS}),
        destroy=extend_schema(responses={204: None, **WRITE_ERRORS}),
    )


@editable_schema(ConnectorSerializer)
class ConnectorViewSet(Editable):
    serializer_class = ConnectorSerializer
    permission_model = "commands.connector"
    filterset_class = ConnectorFilter

    def get_queryset(self):
        return self.scoped(Connector.objects.select_related("tenant"))


# --- sources ------------------------------------------------------------------------------------


class ConnectorIds(serializers.ListField):
    """Written as a list of ids, read from the (prefetched) relation."""

    def to_representation(self, related):
        return sorted(connector.pk for connector in related.all())


class SourceSerializer(Owned):
    connectors = ConnectorIds(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        required=False,
        max_length=1000,
        help_text="Ids of the tenant's connectors this source fans out to.",
    )
    verifier_secrets = serializers.ListField(
        child=serializers.CharField(max_length=1000, trim_whitespace=False),
        write_only=True,
        required=False,
        max_length=20,
        help_text="The signing secrets, newest first. Write-only: never returned.",
    )
    secrets_set = serializers.SerializerMethodField()
    verifier_options = serializers.JSONField(required=False)

    class Meta:
        model = Source
        fields = [
            "id", "tenant", "slug", "connectors", "needs_approval", "verifier", "verifier_secrets",
            "secrets_set", "verifier_options", "dedupe_key", "dedupe_body",
        ]  # fmt: skip

    def get_secrets_set(self, source: Source) -> int:
        return len(source.verifier_secrets or [])

    def validate(self, attrs: dict) -> dict:
        tenant = attrs.get("tenant") or self.instance.tenant
        if "connectors" in attrs:
            wanted = set(attrs["connectors"])
            found = list(Connector.objects.filter(tenant=tenant, pk__in=wanted))
            missing = wanted - {connector.pk for connector in found}
            if missing:
                raise serializers.ValidationError(
                    {"connectors": [f"No connector {pk} for this tenant." for pk in sorted(missing)[:10]]}
                )
            attrs["connectors"] = found
        clean_model(self.instance or Source(), attrs)
        return attrs

    def create(self, validated_data: dict) -> Source:
        connectors = validated_data.pop("connectors", [])
        source = Source.objects.create(**validated_data)
        source.connectors.set(connectors)
        return source

    def update(self, source: Source, validated_data: dict) -> Source:
        connectors = validated_data.pop("connectors", None)
        source = super().update(source, validated_data)
        if connectors is not None:
            source.connectors.set(connectors)
        return source


@editable_schema(SourceSerializer)
class SourceViewSet(Editable):
    serializer_class = SourceSerializer
    permission_model = "commands.source"
    filterset_class = SourceFilter

    def get_queryset(self):
        connectors = Prefetch("connectors", queryset=Connector.objects.only("id"))
        return self.scoped(Source.objects.select_related("tenant").prefetch_related(connectors))


# --- commands -----------------------------------------------------------------------------------


WHY = inline_serializer(
    "Why",
    {
        "key": serializers.CharField(help_text="The skip_reason filter that lists it (empty: none)."),
        "label": serializers.CharField(),
        "reason": serializers.CharField(),
        "next": serializers.CharField(help_text="What happens next."),
        "by": serializers.ChoiceField(choices=[MACHINE, PERSON, NOBODY], help_text="Who makes it."),
        "at": serializers.DateTimeField(
            allow_null=True, help_text="When (machine), or since when (person); null: the next round."
        ),
        "next_check": serializers.DateTimeField(allow_null=True),
        "todo": serializers.CharField(help_text="What a person can do."),
        "text": serializers.CharField(help_text="The same in one line, as the admin says it."),
    },
)


class CommandSerializer(serializers.ModelSerializer):
    """A command as every list shows it: its state and why it waits, not its payload."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    connector_name = serializers.CharField(source="connector.name", read_only=True)
    source = serializers.SlugRelatedField(slug_field="slug", read_only=True, allow_null=True)
    # Empty when there is none: declared so the schema says so ("" or one of the choices).
    last_outlook = serializers.ChoiceField(choices=Outlook.choices, allow_blank=True, read_only=True)
    skip_reason = serializers.ChoiceField(choices=SkipReason.choices, allow_blank=True, read_only=True)
    skip_explanation = serializers.SerializerMethodField()
    why = serializers.SerializerMethodField()

    class Meta:
        model = Command
        fields = [
            "id", "tenant", "connector", "connector_name", "source", "delivery", "idempotency_key",
            "state", "state_changed_at", "last_outlook", "attempts", "next_attempt_at", "skip_reason",
            "skip_explanation", "why", "skip_decided_at", "last_error_class", "last_error", "approved_at",
            "resent_from", "created_at",
        ]  # fmt: skip
        read_only_fields = fields

    def get_skip_explanation(self, command: Command) -> str:
        return explain(command).line()

    @extend_schema_field(WHY)
    def get_why(self, command: Command) -> dict:
        return explain(command).as_dict()


class AttemptSerializer(serializers.ModelSerializer):
    outlook = serializers.ChoiceField(choices=Outlook.choices, allow_blank=True, read_only=True)

    class Meta:
        model = Attempt
        fields = [
            "number", "started_at", "finished_at", "ok", "outlook", "status_code", "error_class",
            "error_message", "response_excerpt", "manual",
        ]  # fmt: skip
        read_only_fields = fields


# The latest attempts a command's detail shows; the whole history is its own cursor-paged list.
DETAIL_ATTEMPTS = 20

LINKS = inline_serializer(
    "CommandLinks",
    {
        "self": serializers.URLField(),
        "attempts": serializers.URLField(),
        "resent_from": serializers.URLField(allow_null=True),
        "resent_as": serializers.ListField(child=serializers.URLField()),
    },
)


class CommandDetailSerializer(CommandSerializer):
    payload = serializers.JSONField(read_only=True)
    resent_as = serializers.SerializerMethodField()
    latest_attempts = serializers.SerializerMethodField()
    links = serializers.SerializerMethodField()

    class Meta(CommandSerializer.Meta):
        fields = [*CommandSerializer.Meta.fields, "payload", "resent_as", "latest_attempts", "links"]
        read_only_fields = fields

    def get_resent_as(self, command: Command) -> list[int]:
        return sorted(copy.pk for copy in command.resent_as.all())  # prefetched by the view

    @extend_schema_field(AttemptSerializer(many=True))
    def get_latest_attempts(self, command: Command) -> list:
        latest = command.attempt_set.order_by("-number")[:DETAIL_ATTEMPTS]
        return AttemptSerializer(reversed(list(latest)), many=True).data

    @extend_schema_field(LINKS)
    def get_links(self, command: Command) -> dict:
        request = self.context.get("request")

        def url(name: str, pk: int) -> str:
            return reverse(name, args=[pk], request=request)

        return {
            "self": url("commands-command-detail", command.pk),
            "attempts": url("commands-command-attempts", command.pk),
            "resent_from": url("commands-command-detail", command.resent_from_id)
            if command.resent_from_id
            else None,
            "resent_as": [url("commands-command-detail", pk) for pk in self.get_resent_as(command)],
        }


# Why a command waits, as the admin's filter reads it (``commands.explain.waiting_for``): each skip
# reason, ``after-fix`` (an outlook, stored as backing off or undecided), a pending resend, none.
WAIT_CHOICES = [(key, key) for key in [AFTER_FIX, *SkipReason.values, RESEND_PENDING, NO_REASON]]


def connector_filter(queryset, name: str, value: str):
    """A connector by id (digits) or by name (several tenants may each have one of that name)."""
    if value.isdigit() and value.isascii():
        if int(value) > MAX_ID:
            return queryset.none()
        return queryset.filter(connector_id=int(value))
    return queryset.filter(connector__name=value)


class CommandFilter(TenantFilterSet):
    """The list's filters; a bulk action's ``filter`` is read by the same set."""

    state = django_filters.ChoiceFilter(choices=State.choices)
    skip_reason = django_filters.ChoiceFilter(
        choices=WAIT_CHOICES, method=lambda queryset, name, value: queryset.filter(waiting_for(value))
    )
    last_outlook = django_filters.ChoiceFilter(choices=Outlook.choices)
    connector = django_filters.CharFilter(method=connector_filter, max_length=100)

    class Meta:
        model = Command
        fields = ["state", "skip_reason", "last_outlook", "tenant", "connector"]


class FilterInput(serializers.Serializer):
    """A bulk action's ``filter``: the list's query parameters as a JSON object."""

    state = serializers.ChoiceField(choices=State.choices, required=False)
    skip_reason = serializers.ChoiceField(choices=WAIT_CHOICES, required=False)
    last_outlook = serializers.ChoiceField(choices=Outlook.choices, required=False)
    tenant = serializers.CharField(max_length=64, required=False)
    connector = serializers.CharField(max_length=100, required=False, help_text="An id, or a name.")


class ActionInput(StrictSerializer):
    dry_run = serializers.BooleanField(required=False, default=False, help_text="Answer the plan only.")
    override = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Resend past the retry guards (non-idempotent connector, unknown outcome); "
        "needs commands.resend_override_command and a reason.",
    )
    reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=2000)


class StrictFilterInput(StrictSerializer, FilterInput):
    pass


class BulkInput(ActionInput):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=MAX_ID),
        required=False,
        min_length=1,
        max_length=MAX_BULK_IDS,
    )
    filter = StrictFilterInput(required=False)

    def validate(self, attrs: dict) -> dict:
        if ("ids" in attrs) == ("filter" in attrs):
            raise serializers.ValidationError({"non_field_errors": ["Give either ids or filter."]})
        if "filter" in attrs and not attrs["filter"]:
            raise serializers.ValidationError(
                {"filter": ["Name at least one filter; an action on every command is not one request."]}
            )
        return attrs


class NewCommandInput(StrictSerializer):
    payload = serializers.JSONField(required=False, help_text="The new payload; omitted: the original's.")
    reason = serializers.CharField(required=False, default="", allow_blank=True, max_length=2000)


def _reasons():
    return serializers.DictField(child=serializers.IntegerField())


PLAN = inline_serializer(
    "ActionPlan",
    {
        "action": serializers.CharField(),
        "total": serializers.IntegerField(),
        "will": serializers.IntegerField(),
        "need_override": _reasons(),
        "cannot": _reasons(),
        "summary": serializers.CharField(),
    },
)
DONE = inline_serializer(
    "ActionDone",
    {
        "action": serializers.CharField(),
        "total": serializers.IntegerField(),
        "done": serializers.IntegerField(),
        "skipped": _reasons(),
        "summary": serializers.CharField(),
        "audit": serializers.IntegerField(),
    },
)
ACTION_ANSWER = PolymorphicProxySerializer(
    component_name="ActionAnswer", serializers=[PLAN, DONE], resource_type_field_name=None
)


def action_schema(request, description: str, operation_id: str):
    return extend_schema(
        operation_id=operation_id,
        request=request,
        responses={200: ACTION_ANSWER, **errors(400, 401, 403, 404, 409)},
        description=description,
    )


def run_action(name: str, queryset, request, data: dict) -> Response:
    """Plan or perform one staff action (``commands.actions``) and answer its dict."""
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


class AttemptCursor(Cursor):
    ordering = "-number"


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


# --- deliveries ---------------------------------------------------------------------------------


class DeliverySerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    source = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    headers = serializers.SerializerMethodField()
    commands = serializers.SerializerMethodField()

    class Meta:
        model = Delivery
        fields = ["id", "tenant", "source", "event_key", "headers", "size", "received_at", "commands"]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField(child=serializers.CharField()))
    def get_headers(self, delivery: Delivery) -> dict:
        return {
            name: value
            for name, value in (delivery.headers or {}).items()
            if not any(marker in name.lower() for marker in SIGNATURE_MARKERS)
        }

    def get_commands(self, delivery: Delivery) -> list[int]:
        return sorted(c.pk for c in delivery.commands.all())


class DeliveryDetailSerializer(DeliverySerializer):
    class Meta(DeliverySerializer.Meta):
        fields = [*DeliverySerializer.Meta.fields, "body"]
        read_only_fields = fields


class DeliveryFilter(TenantFilterSet):
    source = django_filters.CharFilter(field_name="source__slug", max_length=64)
    event_key = django_filters.CharFilter(max_length=255)

    class Meta:
        model = Delivery
        fields = ["tenant", "source", "event_key"]


class DeliveryCursor(NewestFirst):
    page_size = 20  # a body is up to a megabyte; the list leaves it out, but stays short anyway


@readable_schema(DeliverySerializer, DeliveryDetailSerializer)
class DeliveryViewSet(Scoped, viewsets.ReadOnlyModelViewSet):
    pagination_class = DeliveryCursor
    filterset_class = DeliveryFilter
    permission_model = "commands.delivery"

    def get_queryset(self):
        commands = Prefetch("commands", queryset=Command.objects.only("id", "delivery_id"))
        deliveries = Delivery.objects.select_related("tenant", "source").prefetch_related(commands)
        if self.action == "list":
            deliveries = deliveries.defer("body")
        return self.scoped(deliveries)

    def get_serializer_class(self):
        return DeliveryDetailSerializer if self.action == "retrieve" else DeliverySerializer


# --- audit entries ------------------------------------------------------------------------------


class AuditEntrySerializer(serializers.ModelSerializer):
    result = serializers.JSONField(read_only=True)

    class Meta:
        model = AuditEntry
        fields = ["id", "at", "username", "action", "via", "reason", "count", "done", "result"]
        read_only_fields = fields


class AuditEntryDetailSerializer(AuditEntrySerializer):
    commands = serializers.SerializerMethodField()

    class Meta(AuditEntrySerializer.Meta):
        fields = [*AuditEntrySerializer.Meta.fields, "commands"]
        read_only_fields = fields

    def get_commands(self, entry: AuditEntry) -> list[int]:
        return sorted(entry.commands.values_list("pk", flat=True))


class AuditFilter(StrictFilterSet):
    action = django_filters.ChoiceFilter(choices=AuditEntry.Action.choices)
    via = django_filters.ChoiceFilter(choices=[("admin", "admin"), ("api", "API")])
    command = IdFilter(field_name="commands__id")

    class Meta:
        model = AuditEntry
        fields = ["action", "via", "command"]


@readable_schema(AuditEntrySerializer, AuditEntryDetailSerializer)
class AuditEntryViewSet(IdLookup, viewsets.ReadOnlyModelViewSet):
    """Staff only: an audit row names users and spans tenants, so tenant tokens get a 403."""

    pagination_class = NewestFirst
    filterset_class = AuditFilter
    permission_model = "commands.auditentry"
    queryset = AuditEntry.objects.all()

    def get_serializer_class(self):
        return AuditEntryDetailSerializer if self.action == "retrieve" else AuditEntrySerializer
