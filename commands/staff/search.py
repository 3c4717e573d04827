"""The command lists' search: what a person types to find a command, each kind of term through an index.

A search term matches a command when any of these holds (several words: every word matches):

* its id — a bare number is an id (and a key), nothing else: "17" would otherwise find every
  payload with a 17 in it. Quoted ("17") it is text, searched like any other;
* its idempotency key, exactly — an API command's (the unique ``(tenant, idempotency_key)`` index,
  read for each tenant) or a webhook command's delivery's event key (the delivery's unique index);
* its connector's name or its tenant's slug contains the term (those tables are small: their
  matching ids are read first, then the commands' foreign-key indexes);
* its payload's text contains the term, case-insensitively (an order number). PostgreSQL reads the
  trigram index ``commands_payload_trgm_idx`` on ``UPPER(payload::text)`` (migration 0009); SQLite
  has none and scans only the newest ``SQLITE_PAYLOAD_SCAN`` commands — older ones are found by id,
  key, connector or tenant.

Every arm is an indexed lookup, so PostgreSQL can combine them (a bitmap OR) and a search costs what
it finds, not the size of the table. What it does not do: rank results, search a key by substring,
or (on SQLite) find text in the payload of an old command.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.models import Max, Q, TextField
from django.db.models.functions import Cast
from django.db.models.lookups import IContains
from django.utils.text import smart_split, unescape_string_literal

from ankusa_site.core.admin import parse_id
from commands.models import Command, Connector, Delivery
from limits.models import Tenant

# SQLite has no trigram index: the payload is searched among this many newest ids.
SQLITE_PAYLOAD_SCAN = 20_000
# Connectors or tenants whose name matches a term: more than this and the term says little.
MAX_NAMED = 500
# A term longer than any key or name (the keys are 255 characters) is cut here.
MAX_TERM = 255


@dataclass(frozen=True)
class Term:
    text: str
    quoted: bool


def terms(search: str) -> list[Term]:
    """The words of a search, as the admin splits them ("quoted phrases" kept whole)."""
    found = []
    for bit in smart_split(search):
        quoted = bit.startswith(('"', "'")) and bit[0] == bit[-1] and len(bit) > 1
        if quoted:
            bit = unescape_string_literal(bit)
        bit = bit.replace("\x00", "")[:MAX_TERM]
        if bit:
            found.append(Term(bit, quoted))
    return found


def payload_contains(term: str) -> Q:
    """The payload's JSON text holds ``term`` (any case): ``UPPER(payload::text) LIKE UPPER('%term%')``,
    the trigram index's own expression on PostgreSQL."""
    # Django's icontains: UPPER on both sides, in the database (Python's upper differs: "ß" → "SS").
    condition = Q(IContains(Cast("payload", TextField()), term))
    if connection.vendor == "postgresql":
        return condition
    newest = Command.objects.aggregate(top=Max("pk"))["top"] or 0
    return condition & Q(pk__gt=newest - SQLITE_PAYLOAD_SCAN)


def keyed(term: str) -> Q:
    """An API command's idempotency key or a webhook command's event key, exactly."""
    tenants = list(Tenant.objects.order_by().values_list("pk", flat=True)[: MAX_NAMED * 10])
    found = Q(tenant_id__in=tenants, source__isnull=True, idempotency_key=term) & ~Q(idempotency_key="")
    # Read first, as a list: a sub-select in an OR is estimated at half the table by PostgreSQL,
    # which then scans the table instead of combining the arms' indexes.
    deliveries = list(Delivery.objects.filter(event_key=term).values_list("pk", flat=True)[:MAX_NAMED])
    return found | Q(delivery_id__in=deliveries) if deliveries else found


def term_matches(term: Term) -> Q:
    """The commands one term finds (see the module's docstring)."""
    number = None if term.quoted else parse_id(term.text)
    if number is not None:
        return Q(pk=number) | keyed(term.text)
    term = term.text
    found = payload_contains(term) | keyed(term)
    connectors = list(Connector.objects.filter(name__icontains=term).values_list("pk", flat=True)[:MAX_NAMED])
    if connectors:
        found |= Q(connector_id__in=connectors)
    slugs = list(Tenant.objects.filter(slug__icontains=term).values_list("pk", flat=True)[:MAX_NAMED])
    if slugs:
        found |= Q(tenant_id__in=slugs)
    return found


def search(queryset, search_term: str):
    """``queryset`` narrowed to the commands every term of ``search_term`` finds."""
    for term in terms(search_term):
        queryset = queryset.filter(term_matches(term))
    return queryset
