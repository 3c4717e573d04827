"""The pieces of the command lists that must stay cheap on 100,000+ rows: filters, the paginator,
and the columns that say why a command waits.

* **Why it waits** comes from ``commands.staff.explain``: the badge, the line under it (the reason, the
  next event and when) and the next-check column. The skip-reason filter, the API's ``skip_reason``
  and the dashboard's counts use its rule (``waits_for`` / ``waiting_for``), so a badge, a filter
  and a count never disagree.
* **No full count.** The list sets ``show_full_result_count = False`` and pages with
  :class:`CappedPaginator`, which counts at most ``CAP + 1`` rows: on 100,000 failed commands the
  page costs what it costs on 10,000, and the page says "more than 10,000" instead of a number
  nobody needs exactly — in the count, the search's count and the "select all" text alike. An
  action "on everything matching the filter" still acts on every row; its confirmation page counts
  them (the dry run), once, when someone asked for it, and says the list showed only the first.
* **Filters whose choices cost a query** read a bounded sample: the error classes of the
  ``ERROR_CLASS_SAMPLE`` first failed commands in the failed index's order. A class outside the sample
  is still reachable by search (error text) or ``?last_error_class=...``.

What this does not do: estimate a count from the planner's statistics (PostgreSQL's ``reltuples`` is
per table, not per filter, so it would be wrong exactly when a filter is applied).
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.paginator import Paginator
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.timesince import timesince

from ankusa_site.core.admin import parse_id, readable_json
from commands.models import Command, Connector
from commands.retry import SkipReason
from commands.staff.explain import (  # noqa: F401 (waits_for: the dashboard's import)
    AFTER_FIX,
    MACHINE,
    NO_REASON,
    PERSON,
    RESEND_PENDING,
    SKIP_REASONS,
    explain,
    stamp,
    waiting_for,
    waits_for,
)
from commands.states import State


def reason_badge(command: Command, *, detail: bool = False):
    """Why it waits, as a coloured badge, and under it the reason, the next event and when (on a
    command's page, ``detail``: also what to do)."""
    explanation = explain(command)
    line = explanation.line()
    if detail:
        line = f"{line}. What to do: {explanation.todo}."
    return format_html(
        '<span class="ankusa-badge ankusa-tone-{}" title="{}">{}</span><div class="ankusa-why">{}</div>',
        explanation.tone,
        line,
        explanation.label,
        line,
    )


def next_check(command: Command) -> str:
    """When the machine looks at it again: a time, "next round", or none when only a person can act."""
    explanation = explain(command)
    if explanation.by == MACHINE:
        return stamp(explanation.at) if explanation.at else "next round"
    if explanation.by == PERSON:
        return "none: waits for a person"
    return "-"


def short_error(command: Command, chars: int = 100):
    if not command.last_error_class and not command.last_error:
        return "-"
    return format_html(
        "<code>{}</code> {}", command.last_error_class or "?", Truncator(command.last_error).chars(chars)
    )


def age(when, now=None) -> str:
    return timesince(when, now or timezone.now()) if when else "-"


def pretty_json(value):
    """A payload as readable, escaped text in a ``<pre>`` (never interpreted as HTML)."""
    return format_html('<pre class="ankusa-payload">{}</pre>', readable_json(value, indent=2))


class CappedPaginator(Paginator):
    """A paginator that counts at most ``CAP + 1`` rows: ``SELECT COUNT(*) FROM (... LIMIT CAP+1)``.

    ``count`` is the true number up to ``CAP``; beyond it, ``capped`` is true and the pages stop at
    ``CAP`` rows (narrow the filter to reach the rest). 10,000 rows is 100 pages of 100, more than a
    person pages through, and counting them takes a few milliseconds on SQLite and PostgreSQL alike.
    """

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        counted = self.object_list.order_by()[: self.CAP + 1].count()
        self.capped = counted > self.CAP
        return min(counted, self.CAP)

    capped = False


class SkipReasonFilter(admin.SimpleListFilter):
    """By why it waits, as the badge says it: ``after-fix`` first, then each skip reason."""

    title = "why it waits"
    parameter_name = "reason"

    def lookups(self, request, model_admin):
        keys = [
            AFTER_FIX,
            *(reason for reason in SkipReason.values if reason in SKIP_REASONS),
            RESEND_PENDING,
        ]
        return [*((key, SKIP_REASONS[key].label) for key in keys), (NO_REASON, "no reason (decided soon)")]

    def queryset(self, request, queryset):
        value = self.value()
        if value in dict(self.lookup_choices):
            return queryset.filter(waiting_for(value))
        return queryset


class ErrorClassFilter(admin.SimpleListFilter):
    title = "last error class"
    parameter_name = "last_error_class"
    # The choices come from this many failed commands in the index's order (bounded, like the page).
    ERROR_CLASS_SAMPLE = 2000

    def lookups(self, request, model_admin):
        sample = (
            Command.objects.filter(state=State.FAILED)
            .order_by("skip_reason", "-id")
            .values_list("last_error_class", flat=True)[: self.ERROR_CLASS_SAMPLE]
        )
        classes = sorted({name for name in sample if name} | ({self.value()} if self.value() else set()))
        return [(name, name) for name in classes]

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(last_error_class=self.value())
        return queryset


# Age of the command (since it was created): what a person means by "how long has this been stuck".
AGE_BUCKETS = {
    "1h": ("under an hour", None, timedelta(hours=1)),
    "1d": ("1 hour to 1 day", timedelta(hours=1), timedelta(days=1)),
    "7d": ("1 to 7 days", timedelta(days=1), timedelta(days=7)),
    "older": ("older than 7 days", timedelta(days=7), None),
}


class AgeFilter(admin.SimpleListFilter):
    title = "age"
    parameter_name = "age"

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _, _) in AGE_BUCKETS.items()]

    def queryset(self, request, queryset):
        if self.value() not in AGE_BUCKETS:
            return queryset
        _, younger_than, older_than = AGE_BUCKETS[self.value()]
        now = timezone.now()
        if younger_than is not None:
            queryset = queryset.filter(created_at__lte=now - younger_than)
        if older_than is not None:
            queryset = queryset.filter(created_at__gt=now - older_than)
        return queryset


class ConnectorFilter(admin.RelatedFieldListFilter):
    """By connector, named ``tenant/name`` (its own ``str`` shows the tenant's id): one query."""

    def field_choices(self, field, request, model_admin):
        connectors = Connector.objects.select_related("tenant").order_by("tenant__slug", "name")
        return [(connector.pk, f"{connector.tenant.slug}/{connector.name}") for connector in connectors]


class AuditEntryFilter(admin.SimpleListFilter):
    """The commands one audit entry touched (``?audit=<id>``), however many: the audit list links here.

    A value that is no id (``parse_id``: "²", "-1", past 2**63 - 1) is an invalid filter (``?e=1``).
    """

    title = "audit entry"
    parameter_name = "audit"

    def lookups(self, request, model_admin):
        # Shown only while applied: a choice per audit entry would be a list of thousands.
        value = self.value()
        return [(value, f"audit entry {value}")] if value else []

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        audit = parse_id(value)
        if audit is None:
            raise IncorrectLookupParameters(f"audit={value[:40]!r} is not an audit entry id.")
        return queryset.filter(audit_entries=audit)
