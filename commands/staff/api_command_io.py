"""The REST command API's shapes: the serializers of a command and its attempts (with why it waits),
the filters of the command list, and the inputs and answers of the staff actions (``PLAN``,
``DONE``).
"""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import (
    PolymorphicProxySerializer,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers
from rest_framework.reverse import reverse

from ankusa_site.core.api import (
    Cursor,
    StrictSerializer,
)
from commands.models import Attempt, Command
from commands.retry import Outlook, SkipReason
from commands.staff.api_base import MAX_BULK_IDS, MAX_ID, TenantFilterSet
from commands.staff.explain import (
    AFTER_FIX,
    MACHINE,
    NO_REASON,
    NOBODY,
    PERSON,
    RESEND_PENDING,
    explain,
    waiting_for,
)
from commands.states import State

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


# Why a command waits, as the admin's filter reads it (``commands.staff.explain.waiting_for``): each skip
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


class AttemptCursor(Cursor):
    ordering = "-number"
