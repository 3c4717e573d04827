"""REST viewsets for connectors and sources (``/api/v1/connectors/``, ``/api/v1/sources/``): a
tenant's own, created and changed under the model's rules; secrets are write-only (never in an
answer) and a connector or source in use cannot be deleted.
"""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ankusa_site.core.api import (
    clean_model,
)
from commands.models import Connector, Source
from commands.staff import api_pause
from commands.staff.api_base import MAX_ID, Editable, Owned, TenantFilterSet, editable_schema
from commands.staff.health_api import HealthActions


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
    sending = serializers.SerializerMethodField()  # paused or held: commands.staff.api_pause
    headers = serializers.JSONField(required=False)
    status_map = serializers.JSONField(required=False)

    class Meta:
        model = Connector
        fields = [
            "id", "tenant", "name", "kind", "enabled", "idempotent", "url", "method", "headers",
            "connect_timeout_s", "read_timeout_s", "status_map", "secret_header", "secret", "secret_set",
            "max_in_flight", "max_per_s", "hold_after_failures", "sending", "updated_at",
        ]  # fmt: skip
        extra_kwargs = {
            "connect_timeout_s": {"max_value": 3600},
            "read_timeout_s": {"max_value": 3600},
        }

    def get_secret_set(self, connector: Connector) -> bool:
        return bool(connector.secret)

    @extend_schema_field(api_pause.SENDING)
    def get_sending(self, connector: Connector) -> dict:
        return api_pause.sending(connector)

    def validate(self, attrs: dict) -> dict:
        clean_model(self.instance or Connector(), attrs)
        return attrs


@editable_schema(ConnectorSerializer)
class ConnectorViewSet(
    api_pause.PauseActions, HealthActions, Editable
):  # + /health/ (commands.staff.health_api)
    serializer_class = ConnectorSerializer
    permission_model = "commands.connector"
    action_permissions = api_pause.PERMISSIONS
    filterset_class = ConnectorFilter

    def get_queryset(self):
        return self.scoped(Connector.objects.select_related("tenant"))


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
