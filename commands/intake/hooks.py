"""``POST /hooks/<tenant>/<source>/``: a provider's webhook, checked in the order that spends least.

1. unknown or inactive tenant, unknown source, a slug that is not a slug → 404 (no query for a
   slug that cannot exist);
2. a body over the tenant's ``max_body_bytes`` → 413, from ``Content-Length`` before reading, or
   after reading a chunked body only up to the limit;
3. a signature the source's verifier refuses → 401: nothing stored and **no quota spent**;
4. a body that is not UTF-8 JSON a database can store, or lacks the event key the source dedupes
   on → 400;
5. ``commands.intake.submit.submit``: one store call, one transaction, the claim settled →
   202 ``{"status": "accepted", "id": <delivery>, "commands": [...]}``,
   200 ``{"status": "duplicate", "id": <original delivery>}``, or 429 / 409 / 413 / 503.

A database that does not answer anywhere on the way — the source's configuration read included,
whenever its cache has expired — is a 503 ``unavailable`` with ``Retry-After``, never a 500.

Every refusal is JSON ``{"error", "detail"}``; one log line per request (``ankusa.intake``,
``hook_accepted`` / ``hook_duplicate`` / ``hook_refused``) without body, signature or secret.
A plain Django view rather than DRF: this is the hot path, and it needs none of DRF's parsing. The
site's handler (``ankusa_site.handlers``) brings a webhook here past the URL resolver and the
middleware it needs none of (sessions, CSRF, auth, messages), so this view may rely on none of them.

Each process keeps what it read about a source — its verifier, connectors, tenant and the tenant's
effective limits — for ``ANKUSA_INTAKE_CACHE_S`` (1 s): under load that takes three of the
queries off every webhook. When it expires, one thread reads it again while the process's other
threads go on with what they have. Not guaranteed: an edit (a rotated secret, a new connector, a
changed limit, a deactivated tenant) reaches a node up to that long after it was saved, plus the
time of one read. ``ANKUSA_INTAKE_CACHE_S=0`` keeps nothing: every webhook reads its source.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Prefetch
from django.http import HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from ankusa_site.core.answers import answer_unreachable
from ankusa_site.core.logs import log_event
from ankusa_site.core.strict_json import Refusal, parse_json
from commands.intake import event_keys, signatures
from commands.intake.arrival import Arrival, Duplicated
from commands.intake.headers import Headers
from commands.intake.http import measured, read_body, refusal
from commands.intake.submit import submit
from commands.models import KEPT_HEADERS, MAX_KEPT_HEADER_CHARS, Connector, Source
from limits.models import LimitOverride, slug_validator
from limits.quotas import EffectiveLimit, effective_limits, max_body_bytes

logger = logging.getLogger("ankusa.intake")
SLUG = re.compile(slug_validator.regex.pattern)


@csrf_exempt
@measured("hooks")
@answer_unreachable(wrote=False)  # a read on the way (the source's, its cache expired): 503
def receive(request, tenant: str, source: str):
    if request.method != "POST":
        detail = f"{request.method[:10]} is not allowed here; POST a webhook."
        return _refused(None, Refusal(405, "method_not_allowed", detail, {"Allow": "POST"}))
    if not (SLUG.fullmatch(tenant) and SLUG.fullmatch(source)):
        return _refused(None, Refusal(404, "not_found", "No such tenant or source."))
    now = timezone.now()
    route = find_route(tenant, source, now)
    if route is None:
        return _refused(None, Refusal(404, "not_found", "No such tenant or source."))
    found = route.source

    body = read_body(request, max_body_bytes(found.tenant), endpoint="hooks")
    if isinstance(body, Refusal):
        return _refused(found, body)
    if route.verifier is None:
        # Checked when the source is saved; only a row written behind the admin's back gets here.
        detail = "The source's signature verifier is misconfigured; staff must fix it."
        return _refused(found, Refusal(503, "source_misconfigured", detail, {"Retry-After": "60"}))
    headers = Headers.from_environ(request.META)
    problem = route.verifier.verify(headers, body, now.timestamp())
    if problem:
        return _refused(found, Refusal(401, "bad_signature", f"Signature refused: {problem}."))

    parsed = parse_json(body)
    if isinstance(parsed, Refusal):
        return _refused(found, parsed)
    payload, text = parsed
    key = None
    if found.dedupe_key:
        key = event_keys.extract(found.dedupe_key, headers, body, parsed=payload)
        if key is None:
            refused = Refusal(400, "missing_event_key", f"No event id at {found.dedupe_key}.")
            return _refused(found, refused)

    arrival = Arrival(
        tenant=found.tenant,
        connectors=route.connectors,
        payload=payload,
        size=len(body),
        dedupe_key=key,
        claim_key=event_keys.body_key(body) if found.dedupes_body else None,
        source=found,
        headers=kept_headers(headers, route.kept_names),
        body=text,
        limits=route.limits,
    )
    outcome = submit(arrival, now=now)
    refused = refusal(outcome)
    if refused is not None:
        return _refused(found, refused)
    if isinstance(outcome, Duplicated):
        _log("hook_duplicate", found, 200, delivery=outcome.id)
        return _json({"status": "duplicate", "id": outcome.id}, 200, outcome.headers)
    commands = [command.pk for command in outcome.commands]
    _log("hook_accepted", found, 202, delivery=outcome.id, commands=len(commands), size=len(body))
    return _json({"status": "accepted", "id": outcome.id, "commands": commands}, 202, outcome.headers)


@dataclass(frozen=True)
class Route:
    """What a webhook to one source needs to know, read together and kept ``ANKUSA_INTAKE_CACHE_S``:
    the source with its tenant, the tenant's effective limits (its active overrides included), the
    connectors as ``(id, idempotent)``, its verifier (None: the stored configuration is invalid)
    and the names of the headers a delivery keeps."""

    source: Source
    limits: dict[str, EffectiveLimit]
    connectors: list[tuple[int, bool]]
    verifier: signatures.Verifier | None
    kept_names: tuple[str, ...]
    read_at: float


# (tenant slug, source slug) -> Route. Only existing sources are kept (a flood of unknown slugs
# costs a query each, not memory), and the whole map is dropped past MAX_ROUTES.
_routes: dict[tuple[str, str], Route] = {}
MAX_ROUTES = 10_000
# Held by the one thread of a process that reads an expired route again; the others go on with
# the route they have until it is done, instead of all reading it at once every time it expires.
_rereading = threading.Lock()


def find_route(tenant: str, source: str, now) -> Route | None:
    key = (tenant, source)
    route = _routes.get(key)
    if route is None:
        return _read_route(key, now)
    if time.monotonic() - route.read_at < settings.ANKUSA_INTAKE_CACHE_S:
        return route
    if settings.ANKUSA_INTAKE_CACHE_S <= 0:  # nothing is kept
        return _read_route(key, now)
    if not _rereading.acquire(blocking=False):
        return route
    try:
        return _read_route(key, now)
    finally:
        _rereading.release()


def _read_route(key: tuple[str, str], now) -> Route | None:
    tenant, source = key
    found = (
        Source.objects.select_related("tenant")
        .prefetch_related(
            Prefetch(
                "tenant__overrides", queryset=LimitOverride.objects.active(now), to_attr="active_overrides"
            ),
            Prefetch("connectors", queryset=Connector.objects.only("id", "idempotent")),
        )
        .filter(tenant__slug=tenant, tenant__active=True, slug=source)
        .first()
    )
    if found is None:
        _routes.pop(key, None)
        return None
    try:
        verifier = found.build_verifier()
    except signatures.VerifierConfigError:
        verifier = None
    route = Route(
        found,
        effective_limits(found.tenant, now),
        [(c.pk, c.idempotent) for c in found.connectors.all()],
        verifier,
        kept_names(found.dedupe_key),
        time.monotonic(),
    )
    if len(_routes) >= MAX_ROUTES:
        _routes.clear()
    _routes[key] = route
    return route


def forget_routes() -> None:
    """Drop every kept source configuration (tests; the next webhook reads it again)."""
    _routes.clear()


def kept_names(dedupe_key: str) -> tuple[str, ...]:
    """The headers a source's deliveries keep: ``KEPT_HEADERS`` and the one the event key is in."""
    try:
        resolved = event_keys.resolve(dedupe_key)
    except event_keys.EventKeyConfigError:  # refused when saved; extract() says so per request
        resolved = None
    if resolved is not None and resolved[0] == "header":
        return (*KEPT_HEADERS, resolved[1])
    return tuple(KEPT_HEADERS)


def kept_headers(headers: Headers, names: tuple[str, ...]) -> dict[str, str]:
    """The values of the headers ``names`` that a request carries, each cut to its stored length."""
    kept = {}
    for name in names:
        value = headers.get(name)
        if value:
            kept[name] = value[:MAX_KEPT_HEADER_CHARS]
    return kept


def _json(data: dict, status: int, headers: dict[str, str]) -> HttpResponse:
    # What JsonResponse writes, without the DjangoJSONEncoder it builds for every answer: these
    # answers hold only strings and numbers.
    response = HttpResponse(json.dumps(data), status=status, content_type="application/json")
    for name, value in headers.items():
        response[name] = value
    return response


def _refused(source: Source | None, refusal: Refusal) -> HttpResponse:
    _log("hook_refused", source, refusal.status, reason=refusal.code)
    return _json(refusal.data, refusal.status, refusal.headers)


def _log(event: str, source: Source | None, status: int, **fields) -> None:
    log_event(
        logger,
        event,
        level=logging.INFO if status < 500 else logging.WARNING,
        tenant=source.tenant.slug if source else "",
        source=source.slug if source else "",
        status=status,
        **fields,
    )
