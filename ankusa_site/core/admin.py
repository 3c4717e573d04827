"""What every admin page of the site shares: guards that turn input no database can use into the
admin's own answers, and the ``ModelAdmin`` every model admin derives from.

``AdminGuards``, mixed into every admin of the site (ours through ``ModelAdmin``; Django's users
and groups are registered again below with it), answers what Django's admin trusts further than
PostgreSQL and SQLite do — a year past 9999, an id past 2**63 - 1, a NUL, JSON one database
refuses — with a 400, the invalid-filter page (``?e=1``), a form error or "Select a valid choice",
never a 500: which lookups a URL may ask for (none on a secret field), changelist filters, JSON
fields (the webhook intake's own rule), keys in forms, an action's selection and the autocomplete
search. It does not check a value against the rows, or make a filter PostgreSQL can run but SQLite
cannot bind agree across databases. Each guard in full: docs/design.md, *The admin*.
``selected_across`` reads "every row that matches the filter" as Django's own action form does,
for confirmation pages that post it back.
"""

from __future__ import annotations

import json
import re

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers, widgets
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import admin as auth_admin
from django.contrib.auth.models import Group, User
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.db import DataError, models
from django.db.models.constants import LOOKUP_SEP
from django.forms.fields import InvalidJSONInput, JSONString

from ankusa_site.core.logs import is_sensitive
from ankusa_site.core.strict_json import MAX_ID, Refusal, parse_json

# What building or counting a changelist's query raises for a value the database cannot use: a year
# no date holds (ValueError, OverflowError past 9999-12-31), an int SQLite cannot bind
# (OverflowError), a NUL PostgreSQL refuses (DataError, raised by psycopg before sending).
UNUSABLE_LOOKUP = (ValueError, OverflowError, DataError)
_SURROGATE = re.compile("[\ud800-\udfff]")


# What a changelist's URL may compare a field with: what the admin's own filters and links use.
URL_COMPARISONS = frozenset({"exact", "iexact", "in", "isnull", "isempty", "gt", "gte", "lt", "lte"})
# The parts of a date a URL may compare instead (the date hierarchy's, and a day's).
URL_DATE_PARTS = frozenset({"year", "iso_year", "month", "day", "date"})


def url_lookup_allowed(model, lookup: str) -> bool:
    """Whether a changelist of ``model`` may filter by ``lookup`` from its URL (see the module's
    docstring). A name that is no field is left to Django, which answers it as an invalid filter."""
    parts = lookup.split(LOOKUP_SEP)
    opts, field = model._meta, None
    while parts:
        try:
            field = opts.pk if parts[0] == "pk" else opts.get_field(parts[0])
        except FieldDoesNotExist:
            break
        if is_sensitive(field.name):
            return False
        parts.pop(0)
        if not (field.is_relation and field.related_model is not None):
            break
        opts = field.related_model._meta
    if field is None:
        return True
    if isinstance(field, models.JSONField):
        return parts in ([], ["isnull"])
    if parts and parts[0] in URL_DATE_PARTS and isinstance(field, (models.DateField, models.DateTimeField)):
        parts.pop(0)
    return len(parts) <= 1 and all(part in URL_COMPARISONS for part in parts)


def selected_across(request) -> bool:
    """The action form's ``select_across``, read as Django reads it."""
    return forms.BooleanField(required=False).to_python(request.POST.get("select_across"))


def parse_id(text) -> int | None:
    """An id as a query string or a form carries it: ASCII digits (``str.isdigit`` alone would take
    "²", and ``int`` "٣" or "1_0"), at most ``MAX_ID``; otherwise None."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not (isinstance(text, str) and text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return number if number <= MAX_ID else None


def as_key(field: models.Field, value):
    """``value`` as a value of the key ``field`` (a primary key, or what a foreign key points at),
    or None when no row can have it: an integer key takes :func:`parse_id`'s ids only."""
    if isinstance(field, models.IntegerField):
        return parse_id(value)
    try:
        key = field.to_python(value)
    except ValidationError:
        return None
    if isinstance(key, str) and "\x00" in key:
        return None
    return key


def readable_json(value, **options) -> str:
    """JSON as people read it, non-ASCII as it is — unless it holds a lone surrogate (SQLite stored
    them before the admin refused them), which no UTF-8 page can carry: then all of it escaped."""
    text = json.dumps(value, ensure_ascii=False, **options)
    if _SURROGATE.search(text):
        text = json.dumps(value, ensure_ascii=True, **options)
    return text


def _for_a_field(detail: str) -> str:
    # parse_json speaks of a request body; here the JSON is the text of one field.
    if detail.startswith("The body is not JSON: "):
        return "Enter a valid JSON. " + detail.removeprefix("The body is not JSON: ")
    return detail.replace("The body", "The text", 1)


class StorableJSONField(forms.JSONField):
    """A JSON form field that takes only what every database of the site can store and show back.

    The text is parsed by the intake's rule (``ankusa_site.core.strict_json``), so a document the
    admin saves is one a webhook could have brought. ``allow_null`` follows the column: a NOT NULL
    JSON column refuses ``null`` (and an empty field) with an error instead of an IntegrityError.
    ``indent`` pretty-prints the value in the textarea.
    """

    default_error_messages = {
        "null": "This field cannot be null: enter a JSON value ({} for an empty object).",
    }

    def __init__(self, *, allow_null: bool = False, indent: int | None = None, **kwargs):
        self.allow_null, self.indent = allow_null, indent
        super().__init__(**kwargs)

    def to_python(self, value):
        if self.disabled:
            return value
        if value in self.empty_values:
            return None
        if isinstance(value, (list, dict, int, float, JSONString)):
            return value
        # A lone surrogate typed raw (not as an escape) is kept, for parse_json to refuse as not UTF-8.
        parsed = parse_json(str(value).encode("utf-8", "surrogatepass"))
        if isinstance(parsed, Refusal):
            raise ValidationError(_for_a_field(parsed.detail), code="invalid")
        document = parsed[0]
        if document is None and not self.allow_null:  # said here: a required field's own check
            raise ValidationError(self.error_messages["null"], code="null")  # would say "required"
        return JSONString(document) if isinstance(document, str) else document

    def validate(self, value):
        super().validate(value)
        if value is None and not self.allow_null:
            raise ValidationError(self.error_messages["null"], code="null")

    def bound_data(self, data, initial):
        # Django's re-parses the text with json.loads: RecursionError on '[' * 100000, a surrogate
        # that cannot be rendered. A text this field refuses is shown back as it was typed.
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return self.to_python(data)
        except ValidationError:
            return InvalidJSONInput(data)

    def prepare_value(self, value):
        if isinstance(value, InvalidJSONInput):
            return value
        return readable_json(value, indent=self.indent, cls=self.encoder)


class KeysOnly:
    """An autocomplete widget that re-renders an invalid form without a query for a value that is
    no key (Django filters ``id__in=["x"]``: ValueError; a 24-digit id: OverflowError on SQLite)."""

    def optgroups(self, name, value, attr=None):
        remote = self.field.remote_field
        target = remote.model._meta.get_field(
            getattr(remote, "field_name", None) or remote.model._meta.pk.name
        )
        return super().optgroups(name, [v for v in value if as_key(target, v) is not None], attr)


class AutocompleteSelect(KeysOnly, widgets.AutocompleteSelect):
    pass


class AutocompleteSelectMultiple(KeysOnly, widgets.AutocompleteSelectMultiple):
    pass


class KeyedModelMultipleChoiceField(forms.ModelMultipleChoiceField):
    """Django's, refusing a value that is no key before its ``pk__in`` query (OverflowError on
    SQLite for an id past 2**63 - 1) with its own "not a valid value" error."""

    def _check_values(self, value):
        model = self.queryset.model
        key = (
            model._meta.pk
            if self.to_field_name in (None, "pk")
            else model._meta.get_field(self.to_field_name)
        )
        for pk in value:
            if as_key(key, pk) is None:
                raise ValidationError(
                    self.error_messages["invalid_pk_value"], code="invalid_pk_value", params={"pk": pk}
                )
        return super()._check_values(value)


class GuardedChangeList(ChangeList):
    """A changelist whose filters fail as an invalid filter (``?e=1``) when their values cannot be
    used by the database, whichever filter (a field lookup, a list filter, the date hierarchy)."""

    def get_queryset(self, request, exclude_parameters=None):
        if any("\x00" in value for values in self.filter_params.values() for value in values):
            # No column of either database matches a NUL; PostgreSQL would refuse the query.
            raise IncorrectLookupParameters("A filter value holds a NUL character.")
        try:
            return super().get_queryset(request, exclude_parameters)
        except UNUSABLE_LOOKUP as exc:
            raise IncorrectLookupParameters(exc) from exc

    def get_results(self, request):
        # Most of these surface only here, when the filtered query is first compiled and counted.
        try:
            super().get_results(request)
        except UNUSABLE_LOOKUP as exc:
            raise IncorrectLookupParameters(exc) from exc


class AdminGuards:
    """Mixed into every model admin of the site (before Django's class): the guards of this module."""

    def get_changelist(self, request, **kwargs):
        return GuardedChangeList

    def lookup_allowed(self, lookup, value, request=None):
        return url_lookup_allowed(self.model, lookup) and super().lookup_allowed(lookup, value, request)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if isinstance(db_field, models.JSONField) and not db_field.choices:
            kwargs = {"form_class": StorableJSONField, "allow_null": db_field.null, **kwargs}
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = AutocompleteSelect(db_field, self.admin_site, using=kwargs.get("using"))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = AutocompleteSelectMultiple(
                db_field, self.admin_site, using=kwargs.get("using")
            )
        kwargs.setdefault("form_class", KeyedModelMultipleChoiceField)
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    def get_search_results(self, request, queryset, search_term):
        # The autocomplete view searches with its ``term`` as it comes; no text holds a NUL.
        if "\x00" in search_term:
            return queryset.none(), False
        return super().get_search_results(request, queryset, search_term)

    def response_action(self, request, queryset):
        # Django filters by the posted ids as they come: "abc" on an integer key is a ValueError,
        # a 24-digit id an OverflowError on SQLite. Each is refused here, before any query.
        key = self.model._meta.pk
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            if as_key(key, value) is None:
                plural = self.model._meta.verbose_name_plural
                self.message_user(
                    request, f"The selection holds {value[:40]!r}: not an id of {plural}.", messages.ERROR
                )
                return None
        return super().response_action(request, queryset)


class ModelAdmin(AdminGuards, admin.ModelAdmin):
    """The base of every model admin of the site."""


# Django's own admins of people and groups, registered again with the same guards.
if admin.site.is_registered(User):
    admin.site.unregister(User)
if admin.site.is_registered(Group):
    admin.site.unregister(Group)


@admin.register(User)
class UserAdmin(AdminGuards, auth_admin.UserAdmin):
    pass


@admin.register(Group)
class GroupAdmin(AdminGuards, auth_admin.GroupAdmin):
    pass
