"""The tenant-scoping bases every REST viewset here builds on: a staff user sees and changes only
its own tenant's rows (``Scoped``, ``Editable``, ``Owned``, ``TenantFilterSet``, ``TenantField``), looks
rows up by a well-formed id (``IdLookup``: a bad one is a 404, never a 500), pages by id
(``IdCursor``, ``NewestFirst``), and documents its answers (``readable_schema``,
``editable_schema``). Mounted under ``/api/v1/`` by ``commands.staff.api_urls``.
"""

from __future__ import annotations

import django_filters
from django import forms
from django.db.models import ProtectedError
from drf_spectacular.utils import (
    extend_schema,
    extend_schema_view,
)
from rest_framework import exceptions, serializers, viewsets

from ankusa_site.core.api import (
    Access,
    Conflict,
    Cursor,
    StrictFilterSet,
    StrictModelSerializer,
    errors,
)
from commands.intake import rest as intake_api
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
