"""REST read-only viewsets for history: deliveries (a webhook's request as stored) and the staff
audit log; a tenant's own only.
"""

from __future__ import annotations

import django_filters
from django.db.models import Prefetch
from drf_spectacular.utils import (
    extend_schema_field,
)
from rest_framework import serializers, viewsets

from ankusa_site.core.api import (
    StrictFilterSet,
)
from commands.models import AuditEntry, Command, Delivery
from commands.staff.api_base import (
    SIGNATURE_MARKERS,
    IdFilter,
    IdLookup,
    NewestFirst,
    Scoped,
    TenantFilterSet,
    readable_schema,
)


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


class AuditEntrySerializer(serializers.ModelSerializer):
    result = serializers.JSONField(read_only=True)

    class Meta:
        model = AuditEntry
        fields = ["id", "at", "username", "action", "via", "reason", "count", "done", "result", "connector"]
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
