"""REST endpoints for tenants and their limit overrides.

* ``GET /api/v1/tenants/`` (cursor pages by slug), ``GET /api/v1/tenants/{slug}/``: tenants with
  their own limits and each kind's effective limit and its source. ``POST`` / ``PUT`` /
  ``PATCH``: slug (on create), name, active, max_body_bytes, and the tenant's own limits
  (``hooks_rate`` with ``hooks_burst``, ``bytes_rate`` with ``bytes_burst``: both of a kind or
  neither; null: the site default), checked as the admin checks them. A change of its own limits
  resets the tenant's buckets, as in the admin. Any field a tenant does not have is a 400;
  ``limits`` is what applies, read-only. Overrides, which win over both:
* ``GET|PUT|DELETE /api/v1/tenants/{slug}/limits/{kind}/``: one kind's effective limit; PUT sets
  the override (exactly ``rate``, ``burst`` and a ``reason``, optional ``expires_at``; any other field
  is a 400), DELETE removes it. Both reset the tenant's buckets (``limits.actions``).

Staff need ``limits.view_tenant`` to read and ``limits.add|change_tenant`` / ``limits.*_limitoverride``
to write (``limits.permissions.ApiPermission``). A tenant token reads its own tenant and limits only;
any other tenant is a 404, like one that does not exist. Every error is JSON
``{"error": code, "detail": text}`` (validation errors add ``fields``).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.response import Response
from rest_framework.views import APIView

from ankusa_site.core.api import (
    Access,
    Cursor,
    FloatNumber,
    StrictModelSerializer,
    StrictSerializer,
    clean_model,
    errors,
)
from limits import actions
from limits.authentication import tenant_of
from limits.models import OWN_LIMIT_FIELDS, SLUG_PATTERN, Kind, LimitOverride, Tenant, slug_validator
from limits.quotas import EffectiveLimit, effective_limits, max_body_bytes

# A PUT body is four small fields; anything much bigger is not one.
MAX_PUT_BYTES = 4096
# The model's slug rule, unanchored for the router's pattern of a tenant's URL.
SLUG = SLUG_PATTERN.removeprefix("^").removesuffix("$")


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


LIMIT = inline_serializer(
    "EffectiveLimit",
    {
        "rate": serializers.FloatField(allow_null=True),
        "burst": serializers.IntegerField(allow_null=True),
        "source": serializers.ChoiceField(choices=["override", "tenant", "default", "unlimited"]),
    },
)


class TenantSerializer(StrictModelSerializer):
    """A tenant; ``max_body_bytes`` is written as the tenant's own (null: the site default) and read
    as the one that applies. The own limits are read and written as stored (null: not set)."""

    limits = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = ["slug", "name", "active", "max_body_bytes", *OWN_LIMIT_FIELDS, "limits"]
        extra_kwargs = {"max_body_bytes": {"max_value": 2**31 - 1}} | {
            name: {"max_value": 2**31 - 1} for name in OWN_LIMIT_FIELDS if name.endswith("_burst")
        }

    @extend_schema_field(serializers.DictField(child=LIMIT))
    def get_limits(self, tenant: Tenant) -> dict:
        return {kind: limit_fields(effective) for kind, effective in effective_limits(tenant).items()}

    def to_representation(self, tenant: Tenant) -> dict:
        data = super().to_representation(tenant)
        data["max_body_bytes"] = max_body_bytes(tenant)
        return data

    def validate(self, attrs: dict) -> dict:
        if self.instance is not None and "slug" in attrs and attrs["slug"] != self.instance.slug:
            raise serializers.ValidationError({"slug": ["A tenant's slug does not change."]})
        clean_model(self.instance or Tenant(), attrs)
        return attrs


class SlugCursor(Cursor):
    ordering = "slug"


class TenantViewSet(
    Access,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    serializer_class = TenantSerializer
    pagination_class = SlugCursor
    lookup_field = "slug"
    lookup_value_regex = SLUG
    permission_model = "limits.tenant"
    tenant_reads = True

    def perform_update(self, serializer):
        stored = [getattr(serializer.instance, name) for name in OWN_LIMIT_FIELDS]
        tenant = serializer.save()
        if [getattr(tenant, name) for name in OWN_LIMIT_FIELDS] != stored:
            actions.reset_buckets_on_commit(tenant)

    def get_queryset(self):
        active = LimitOverride.objects.active(timezone.now())
        tenants = Tenant.objects.prefetch_related(
            Prefetch("overrides", queryset=active, to_attr="active_overrides")
        )
        own = tenant_of(self.request.user)
        return tenants if own is None else tenants.filter(pk=own.pk)


class OverrideInput(StrictSerializer):
    rate = FloatNumber()
    burst = serializers.IntegerField()
    reason = serializers.CharField(max_length=500, allow_blank=True, required=False, default="")
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


OVERRIDE_FIELDS = (
    "Override",
    {
        "rate": serializers.FloatField(),
        "burst": serializers.IntegerField(),
        "reason": serializers.CharField(),
        "set_by": serializers.CharField(allow_null=True),
        "set_at": serializers.DateTimeField(),
        "expires_at": serializers.DateTimeField(allow_null=True),
        "active": serializers.BooleanField(),
    },
)
TENANT_LIMIT = inline_serializer(
    "TenantLimit",
    {
        "tenant": serializers.CharField(),
        "kind": serializers.ChoiceField(choices=Kind.values),
        "rate": serializers.FloatField(allow_null=True),
        "burst": serializers.IntegerField(allow_null=True),
        "source": serializers.ChoiceField(choices=["override", "tenant", "default", "unlimited"]),
        "override": inline_serializer(*OVERRIDE_FIELDS, allow_null=True),
    },
)


class TenantLimit(Access, APIView):
    permission_model = "limits.limitoverride"
    # PUT creates or changes an override: it needs both.
    action_permissions = {"put": ("limits.add_limitoverride", "limits.change_limitoverride")}
    tenant_reads = True

    def tenant_and_kind(self, slug: str, kind: str) -> tuple[Tenant, str]:
        if kind not in Kind.values:
            raise exceptions.NotFound(f"Unknown kind {kind[:20]!r}: use one of {', '.join(Kind.values)}.")
        if not slug_validator.regex.fullmatch(slug):
            # No tenant has it, and a NUL in it would be a database error: the 404 of a missing
            # tenant, without asking. (fullmatch: the validator's "$" also passes "acme\n".)
            raise exceptions.NotFound("No Tenant matches the given query.")
        own = tenant_of(self.request.user)
        tenants = Tenant.objects.all() if own is None else Tenant.objects.filter(pk=own.pk)
        return get_object_or_404(tenants, slug=slug), kind

    @extend_schema(responses={200: TENANT_LIMIT, **errors(401, 403, 404)})
    def get(self, request, slug: str, kind: str):
        tenant, kind = self.tenant_and_kind(slug, kind)
        return Response(limit_payload(tenant, effective_limits(tenant)[kind]))

    @extend_schema(
        request=OverrideInput,
        responses={
            200: TENANT_LIMIT,
            201: TENANT_LIMIT,
            **errors(400, 401, 403, 404, 413),
        },
    )
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

    @extend_schema(responses={204: None, **errors(401, 403, 404)})
    def delete(self, request, slug: str, kind: str):
        tenant, kind = self.tenant_and_kind(slug, kind)
        if not actions.remove_override(tenant, kind, by=request.user):
            raise exceptions.NotFound(f"Tenant {tenant.slug} has no {kind} override.")
        return Response(status=status.HTTP_204_NO_CONTENT)
