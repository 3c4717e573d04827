"""What every REST endpoint shares: errors as ``{"error": code, "detail": text}``, the model
validation the API runs, and (re-exported from ``ankusa_site.core.permissions``) who may do what.

DRF's own handler decides the status; this reshapes its body so clients parse one shape
everywhere. Validation errors keep the per-field messages under ``fields`` as well. Paths that
no view answers (404) and server errors (500) under ``/api/`` and ``/hooks/`` get the same shape
from ``ankusa_site.urls``' handlers instead of Django's HTML pages. Hostile input is a 4xx, never
a 500: JSON nested too deep, NUL characters, lone surrogates and numbers no database stores (refused
by ``ankusa_site.core.parsers`` for every body, the JSON fields' included), ids
past 2**63-1 (refused before any query), a cursor whose position is not a value of the list's
ordering (:class:`Cursor`), and any text the renderer is handed (``ankusa_site.core.renderers``).
A database or Redis that does not answer, anywhere on a request's way (authentication included),
is a 503 ``unavailable`` with ``Retry-After`` (``ankusa_site.core.answers.unreachable``), never a 500;
any other view's 503 (a queue backend's) gets ``Retry-After`` too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import django_filters
from django import forms
from django.core.exceptions import FieldDoesNotExist, RequestDataTooBig
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import models
from django.db.models.constants import LOOKUP_SEP
from django.http import Http404, UnreadablePostError
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema_field, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.pagination import CursorPagination
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler

from ankusa_site.core.answers import RETRY_AFTER_S, log_unreachable, unavailable_detail, unreachable
from ankusa_site.core.middleware import late, late_detail
from ankusa_site.core.permissions import Access  # noqa: F401 - the views' one import


class TooLarge(exceptions.APIException):
    status_code = 413
    default_code = "too_large"
    default_detail = "The body is larger than this site reads (ANKUSA_MAX_REQUEST_BYTES)."


def json_errors(exc, context):
    """DRF's handler, reshaped into ``{"error": code, "detail": text}``."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    elif isinstance(exc, RequestDataTooBig):
        exc = TooLarge()
    elif isinstance(exc, UnreadablePostError | exceptions.ParseError) and late(context["request"]):
        exc = RequestTimeout(late_detail())  # the body was cut at its deadline
    elif isinstance(exc, UnreadablePostError):  # the client went away mid-body
        exc = exceptions.ParseError("The body was cut off.")
    elif service := unreachable(exc):
        log_unreachable(context["request"], service, exc)
        exc = Unavailable(unavailable_detail(service, context["request"].method))
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        text = "; ".join(line for name, errors in fields.items() for line in _messages(str(name), errors))
        response.data = {"error": code, "detail": text, "fields": fields}
    else:
        response.data = {"error": code, "detail": str(exc.detail)}
    if response.status_code == 503 and "Retry-After" not in response:  # any view's backend outage
        response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def _messages(name: str, errors) -> Iterator[str]:
    """``name: message …`` for each field with messages, a nested one named by its path (``ids[0]``,
    ``payload.order``): DRF keys a list's errors by index and a nested serializer's by field, and
    printing those as they were said ``ids: 0``, without the message."""
    if isinstance(errors, dict):
        for key, inner in errors.items():
            yield from _messages(f"{name}[{key}]" if isinstance(key, int) else f"{name}.{key}", inner)
    elif isinstance(errors, list) and any(isinstance(inner, dict | list) for inner in errors):
        for index, inner in enumerate(errors):
            if inner:  # a many=True serializer leaves an empty dict for each valid item
                yield from _messages(f"{name}[{index}]", inner)
    else:
        yield f"{name}: {' '.join(map(str, errors if isinstance(errors, list) else [errors]))}"


class RequestTimeout(exceptions.APIException):
    status_code = 408
    default_code = "request_timeout"
    default_detail = "The body did not arrive in time."


class Unavailable(exceptions.APIException):
    status_code = 503
    default_code = "unavailable"
    default_detail = "A service this request needs did not answer; retry after the time in Retry-After."
    wait = RETRY_AFTER_S  # DRF's handler answers it as Retry-After


class Conflict(exceptions.APIException):
    status_code = 409
    default_code = "conflict"
    default_detail = "The request conflicts with the current state."


def clean_model(instance, attrs: dict, *, exclude: tuple[str, ...] = ()) -> None:
    """The model's own validation (field validators, ``clean()``, unique constraints) on a copy of
    ``instance`` with ``attrs`` applied, as DRF errors: the API refuses exactly what the admin
    refuses, and a duplicate name is a 400 rather than an IntegrityError. Many-to-many values are
    not applied. ``instance`` itself keeps what was stored until the serializer saves, so a view
    can still tell what a write changed."""
    candidate = copy.copy(instance)
    many_to_many = {f.name for f in instance._meta.many_to_many}
    for name, value in attrs.items():
        if name not in many_to_many:
            setattr(candidate, name, value)
    try:
        candidate.full_clean(exclude=list(exclude))
    except DjangoValidationError as exc:
        errors = exc.message_dict
        if "__all__" in errors:  # DRF's name for an error of no one field
            errors["non_field_errors"] = errors.pop("__all__")
        raise exceptions.ValidationError(errors) from None


# Per field, DRF's messages: a list of strings, or nested objects for nested fields.
@extend_schema_field({"type": "object"})
class _FieldErrors(serializers.Field):
    pass


ERROR = inline_serializer(
    "Error",
    {
        "error": serializers.CharField(),
        "detail": serializers.CharField(),
        "fields": _FieldErrors(required=False),
    },
)


def errors(*statuses: int) -> dict:
    """The schema's answers for these error statuses: the ``Error`` body."""
    return {status: OpenApiResponse(ERROR) for status in statuses}


class FloatNumber(serializers.FloatField):
    """A JSON number: ``true`` is not 1.0, as DRF's ``FloatField`` would read it."""

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


class RefusesUnknownFields:
    """A request body that refuses fields it does not know: a misspelt one is a 400 reported with
    every other problem of the body, never silently ignored (an ignored filter widens a bulk
    action, an ignored option changes nothing the client asked for, an ignored setting leaves a
    connector as it was while the client reads 200)."""

    def problems(self, data: dict) -> dict:
        """What the fields themselves let pass, by field name; a subclass may add its own."""
        return {name: ["Unknown field."] for name in sorted(set(data) - set(self.fields))}

    def to_internal_value(self, data):
        problems = self.problems(data) if isinstance(data, dict) else {}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError({**exc.detail, **problems}) from None
        if problems:
            raise serializers.ValidationError(problems)
        return value


class StrictSerializer(RefusesUnknownFields, serializers.Serializer):
    """An input body (``RefusesUnknownFields``)."""


class StrictModelSerializer(RefusesUnknownFields, serializers.ModelSerializer):
    """A model written through the API (``RefusesUnknownFields``). Its read-only fields may come
    back, ignored, so a client can send what it read; its float fields refuse ``true``."""

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.FloatField: FloatNumber,
    }


class TrueOrFalse(forms.NullBooleanField):
    """``true`` or ``false`` (also ``1``/``0``, any case), or nothing; anything else is invalid.
    Django's own field reads an unknown value as nothing."""

    widget = forms.TextInput
    VALUES = {"true": True, "1": True, "false": False, "0": False}

    def to_python(self, value):
        text = "" if value is None else str(value).strip().lower()
        if text == "":
            return None
        if text not in self.VALUES:
            raise DjangoValidationError("Use true or false.", code="invalid")
        return self.VALUES[text]


class StrictBooleanFilter(django_filters.BooleanFilter):
    """A boolean filter whose unknown value is a 400 (``TrueOrFalse``): django-filter's own reads
    it as "no filter", which answers every row."""

    field_class = TrueOrFalse


class StrictFilterSet(django_filters.FilterSet):
    """A list's filters, whose booleans are ``StrictBooleanFilter``."""

    FILTER_DEFAULTS = {
        **django_filters.FilterSet.FILTER_DEFAULTS,
        models.BooleanField: {"filter_class": StrictBooleanFilter},
    }


class StrictFilterBackend(DjangoFilterBackend):
    """django-filter's backend (``REST_FRAMEWORK["DEFAULT_FILTER_BACKENDS"]``), which also refuses a
    list's query parameter that is neither one of its filters nor the pagination's nor ``format``:
    a misspelt filter (``?stat=failed``) would otherwise answer every row as if it had narrowed
    them. A 400 names each unknown parameter and lists the known ones."""

    def filter_queryset(self, request, queryset, view):
        if getattr(view, "action", None) == "list":
            filterset = self.get_filterset_class(view, queryset)
            known = set(filterset.base_filters) if filterset is not None else set()
            refuse_unknown_query_params(request, known | paging_params(getattr(view, "paginator", None)))
        return super().filter_queryset(request, queryset, view)


def paging_params(paginator) -> set[str]:
    """The query parameters ``paginator`` reads."""
    names = ("cursor_query_param", "page_query_param", "page_size_query_param")
    return {getattr(paginator, name) for name in names if getattr(paginator, name, None)}


def refuse_unknown_query_params(request, known: set[str]) -> None:
    """A 400 naming each query parameter that is not in ``known`` (nor ``format``), listing those
    that are: a misspelt one would otherwise be ignored, and answer as if it had done its part."""
    known = known | {api_settings.URL_FORMAT_OVERRIDE}
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        hint = f"Unknown query parameter; use {', '.join(sorted(known))}."
        raise exceptions.ValidationError({name[:64]: [hint] for name in unknown[:20]})


class Cursor(CursorPagination):
    """Cursor pages (every list's, and ``REST_FRAMEWORK["DEFAULT_PAGINATION_CLASS"]``): DRF's, whose
    cursor position must also be a value of the ordering field. DRF checks only that a cursor
    decodes, then filters by its position as given: ``p=abc`` on an id ordering was a ValueError,
    ``p=\\x00`` a PostgreSQL DataError, both 500s. A position the field cannot read
    (``to_python``), or holding a NUL, is answered as DRF answers a cursor that does not decode: 404
    ``Invalid cursor``. A whole number past 64 bits passes; Django answers it without a comparison
    in the database. The default ordering is newest first: DRF's (``-created``) names a field no
    model here has."""

    ordering = "-id"

    def paginate_queryset(self, queryset, request, view=None):
        self.model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None and not self.holds(cursor.position):
            raise exceptions.NotFound(self.invalid_cursor_message)
        return cursor

    def holds(self, position: str) -> bool:
        """Whether ``position`` is a value of the ordering's first field (no NUL, in any field)."""
        if "\x00" in position:
            return False
        try:
            field = ordering_field(self.model, self.ordering[0])
        except FieldDoesNotExist:  # an annotation: the database is the judge
            return True
        try:
            field.to_python(position)
        except (DjangoValidationError, ValueError, TypeError):
            return False
        return True


def ordering_field(model, ordering: str) -> models.Field:
    """The model field an ordering term (``-id``, ``tenant__slug``) sorts by."""
    for name in ordering.lstrip("-").split(LOOKUP_SEP):
        field = model._meta.get_field(name)
        model = field.related_model
    return field
