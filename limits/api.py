"""REST endpoints for tenants and their limit overrides (staff only for now).

* ``GET /api/v1/tenants/``: tenants with each kind's effective limit and its source.
* ``GET|PUT|DELETE /api/v1/tenants/{slug}/limits/{kind}/``: one kind's effective limit; PUT sets
  the override (exactly ``rate`` and ``burst``, optional ``reason``/``expires_at``; any other field
  is a 400), DELETE removes it. Both reset the tenant's buckets (``limits.actions``).

Every error is JSON ``{"error": code, "detail": text}`` (validation errors add ``fields``). A later
issue replaces ``IsAdminUser`` with the full permission matrix (tenant tokens).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Prefetch
from django.http import Http404
from django.shortcuts import get_object_or_404
from django.utils import timezone
from rest_framework import exceptions, serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.pagination import CursorPagination
from rest_framework.permissions import IsAdminUser
from rest_framework.response import Response
from rest_framework.views import APIView, exception_handler

from limits import actions
from limits.models import Kind, LimitOverride, Tenant
from limits.quotas import EffectiveLimit, effective_limits, max_body_bytes

# A PUT body is four small fields; anything much bigger is not one.
MAX_PUT_BYTES = 4096


def json_errors(exc, context):
    """DRF's handler, reshaped into ``{"error": code, "detail": text}``."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        text = "; ".join(f"{name}: {' '.join(map(str, msgs))}" for name, msgs in fields.items())
        response.data = {"error": code, "detail": text, "fields": fields}
    else:
        response.data = {"error": code, "detail": str(exc.detail)}
    return response


class StaffAPIView(APIView):
    permission_classes = [IsAdminUser]

    def get_exception_handler(self):
        return json_errors


def limit_fields(effective: EffectiveLimit) -> dict:
    limit = effective.limit
    return {
        "rate": limit.rate if limit else None,
        "burst": limit.burst if limit else None,
        "source": effective.source,
    }


def limit_payload(tenant: Tenant, effective: EffectiveLimit) -> dict:
    """One kind's effective limit and the override row, if any (active or expired)."""
    override = effective.override or (
        LimitOverride.objects.filter(tenant=tenant, kind=effective.kind).select_related("set_by").first()
    )
    payload = {"tenant": tenant.slug, "kind": effective.kind, **limit_fields(effective), "override": None}
    if override is not None:
        payload["override"] = {
            "rate": override.rate,
            "burst": override.burst,
            "reason": override.reason,
            "set_by": override.set_by.get_username() if override.set_by else None,
            "set_at": override.set_at,
            "expires_at": override.expires_at,
            "active": effective.override is not None,
        }
    return payload


class TenantSerializer(serializers.ModelSerializer):
    limits = serializers.SerializerMethodField()
    max_body_bytes = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = ["slug", "name", "active", "max_body_bytes", "limits"]

    def get_limits(self, tenant: Tenant) -> dict:
        return {kind: limit_fields(effective) for kind, effective in effective_limits(tenant).items()}

    def get_max_body_bytes(self, tenant: Tenant) -> int:
        return max_body_bytes(tenant)


class SlugCursor(CursorPagination):
    ordering = "slug"


class TenantList(StaffAPIView, ListAPIView):
    serializer_class = TenantSerializer
    pagination_class = SlugCursor

    def get_queryset(self):
        active = LimitOverride.objects.active(timezone.now())
        return Tenant.objects.prefetch_related(
            Prefetch("overrides", queryset=active, to_attr="active_overrides")
        )


class OverrideInput(serializers.Serializer):
    rate = serializers.FloatField()
    burst = serializers.IntegerField()
    reason = serializers.CharField(max_length=500, allow_blank=True, required=False, default="")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)

    def to_internal_value(self, data):
        """Every problem at once: a typo'd field name is reported with the field it left missing."""
        errors = {}
        if isinstance(data, dict):
            errors = {name: ["Unknown field."] for name in sorted(set(data) - set(self.fields))}
            # JSON true is not a rate: DRF's FloatField would read it as 1.0.
            errors.update(
                {
                    name: ["Must be a number."]
                    for name in ("rate", "burst")
                    if isinstance(data.get(name), bool)
                }
            )
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError({**exc.detail, **errors}) from None
        if errors:
            raise serializers.ValidationError(errors)
        return value


class TenantLimit(StaffAPIView):
    def tenant_and_kind(self, slug: str, kind: str) -> tuple[Tenant, str]:
        if kind not in Kind.values:
            raise exceptions.NotFound(f"Unknown kind {kind[:20]!r}: use one of {', '.join(Kind.values)}.")
        return get_object_or_404(Tenant, slug=slug), kind

    def get(self, request, slug: str, kind: str):
        tenant, kind = self.tenant_and_kind(slug, kind)
        return Response(limit_payload(tenant, effective_limits(tenant)[kind]))

    def put(self, request, slug: str, kind: str):
        if int(request.META.get("CONTENT_LENGTH") or 0) > MAX_PUT_BYTES:
            return Response(
                {"error": "too_large", "detail": f"A limit is at most {MAX_PUT_BYTES} bytes of JSON."},
                status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            )
        tenant, kind = self.tenant_and_kind(slug, kind)
        data = OverrideInput(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            _, created = actions.set_override(tenant, kind, by=request.user, **data.validated_data)
        except DjangoValidationError as exc:
            raise exceptions.ValidationError(exc.message_dict) from None
        payload = limit_payload(tenant, effective_limits(tenant)[kind])
        return Response(payload, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def delete(self, request, slug: str, kind: str):
        tenant, kind = self.tenant_and_kind(slug, kind)
        if not actions.remove_override(tenant, kind):
            raise exceptions.NotFound(f"Tenant {tenant.slug} has no {kind} override.")
        return Response(status=status.HTTP_204_NO_CONTENT)
