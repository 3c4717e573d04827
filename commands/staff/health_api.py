"""Connector health in the REST API: ``GET /api/v1/connectors/{id}/health/`` and
``GET /api/v1/connectors/health/`` (every connector the caller may see, in id-cursor pages, with the
connector list's filters). Mixed into ``commands.api.ConnectorViewSet``, so both answer to its
permissions (``view_connector`` for staff, a tenant token its own connectors) and scoping; the
figures are ``commands.health_figures.figures``'s (three queries per page, whatever the attempts)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.response import Response

from ankusa_site.core.api import errors, paging_params, refuse_unknown_query_params
from commands import health_figures


class WindowSerializer(serializers.Serializer):
    sends = serializers.IntegerField()
    ok = serializers.IntegerField()
    success_rate = serializers.FloatField(allow_null=True, help_text="ok / sends; null without sends.")
    p50_s = serializers.FloatField(
        allow_null=True,
        help_text="Upper bound (seconds) of the send-time histogram bin holding the median; "
        "null without sends or past the last bound (see p50).",
    )
    p95_s = serializers.FloatField(allow_null=True, help_text="As p50_s, for the 95th percentile.")
    p50 = serializers.CharField(help_text='The same in words: "≤ 100 ms", "> 300 s", "-".')
    p95 = serializers.CharField()


class LastErrorSerializer(serializers.Serializer):
    error_class = serializers.CharField()
    detail = serializers.CharField()
    at = serializers.DateTimeField()


class HealthSerializer(serializers.Serializer):
    connector = serializers.IntegerField()
    tenant = serializers.CharField()
    name = serializers.CharField()
    last_hour = WindowSerializer(help_text="The current minute and the 59 before it.")
    last_day = WindowSerializer(help_text="The current hour and the 23 before it.")
    consecutive_failures = serializers.IntegerField()
    last_error = LastErrorSerializer(allow_null=True)
    last_ok_at = serializers.DateTimeField(allow_null=True)
    waiting = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Its commands waiting, by why (the failed list's reason keys, and to-go for approved "
        "or queued), each counted up to waiting_capped_at + 1.",
    )
    waiting_capped_at = serializers.IntegerField()


def health_rows(connectors) -> list[dict]:
    found = health_figures.figures([c.pk for c in connectors])
    return [{**found[c.pk].as_dict(), "tenant": c.tenant.slug, "name": c.name} for c in connectors]


class HealthActions:
    """The two health views of the connector viewset."""

    @extend_schema(responses={200: HealthSerializer, **errors(401, 403, 404)}, filters=False)
    @action(detail=True, methods=["get"], filter_backends=[])
    def health(self, request, pk=None):
        """One connector's health: sends, success rate and send time over the last hour and day,
        consecutive failures, last error, and its commands waiting by reason."""
        refuse_unknown_query_params(request, set())
        return Response(HealthSerializer(health_rows([self.get_object()])[0]).data)

    @extend_schema(responses={200: HealthSerializer(many=True), **errors(400, 401, 403)})
    @action(detail=False, methods=["get"], url_path="health")
    def health_list(self, request):
        """Every connector's health, in id order and cursor pages, filtered as the connector list."""
        filterset = self.filterset_class(request.query_params, queryset=self.get_queryset(), request=request)
        refuse_unknown_query_params(request, set(filterset.base_filters) | paging_params(self.paginator))
        if not filterset.is_valid():
            raise serializers.ValidationError(filterset.errors)
        page = self.paginate_queryset(filterset.qs)
        return self.get_paginated_response(HealthSerializer(health_rows(page), many=True).data)
