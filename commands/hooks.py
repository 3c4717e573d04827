"""``POST /hooks/<tenant>/<source>/``: a provider's webhook, checked in the order that spends least.

1. unknown or inactive tenant, unknown source, a slug that is not a slug → 404 (no query for a
   slug that cannot exist);
2. a body over the tenant's ``max_body_bytes`` → 413, from ``Content-Length`` before reading, or
   after reading a chunked body only up to the limit;
3. a signature the source's verifier refuses → 401: nothing stored and **no quota spent**;
4. a body that is not UTF-8 JSON a database can store, or lacks the event key the source dedupes
   on → 400;
5. ``commands.intake.submit``: one store call, one transaction, the claim settled →
   202 ``{"status": "accepted", "id": <delivery>, "commands": [...]}``,
   200 ``{"status": "duplicate", "id": <original delivery>}``, or 429 / 409 / 413 / 503.

Every refusal is JSON ``{"error", "detail"}``; one log line per request (``ankusa.intake``,
``hook_accepted`` / ``hook_duplicate`` / ``hook_refused``) without body, signature or secret.
A plain Django view rather than DRF: this is the hot path, and it needs none of DRF's parsing.
"""

from __future__ import annotations

import logging

from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from ankusa_site.api import error
from ankusa_site.logs import log_event
from commands import event_keys, intake, signatures
from commands.models import KEPT_HEADERS, MAX_KEPT_HEADER_CHARS, Connector, Source
from limits.quotas import max_body_bytes

logger = logging.getLogger("ankusa.intake")


@csrf_exempt
def receive(request, tenant: str, source: str):
    if request.method != "POST":
        return error(
            "method_not_allowed",
            f"{request.method[:10]} is not allowed here; POST a webhook.",
            405,
            Allow="POST",
        )
    if not (intake.SLUG.match(tenant) and intake.SLUG.match(source)):
        return _refused(None, intake.Refusal(404, "not_found", "No such tenant or source."))
    found = (
        Source.objects.select_related("tenant")
        .filter(tenant__slug=tenant, tenant__active=True, slug=source)
        .first()
    )
    if found is None:
        return _refused(None, intake.Refusal(404, "not_found", "No such tenant or source."))

    body = intake.read_body(request, max_body_bytes(found.tenant))
    if isinstance(body, intake.Refusal):
        return _refused(found, body)
    now = timezone.now()
    try:
        problem = found.build_verifier().verify(request.headers, body, now.timestamp())
    except signatures.VerifierConfigError:
        # Checked when the source is saved; only a row written behind the admin's back gets here.
        detail = "The source's signature verifier is misconfigured; staff must fix it."
        return _refused(found, intake.Refusal(503, "source_misconfigured", detail, {"Retry-After": "60"}))
    if problem:
        return _refused(found, intake.Refusal(401, "bad_signature", f"Signature refused: {problem}."))

    parsed = intake.parse_json(body)
    if isinstance(parsed, intake.Refusal):
        return _refused(found, parsed)
    payload, text = parsed
    key = None
    if found.dedupe_key:
        key = event_keys.extract(found.dedupe_key, request.headers, body, parsed=payload)
        if key is None:
            refusal = intake.Refusal(400, "missing_event_key", f"No event id at {found.dedupe_key}.")
            return _refused(found, refusal)

    arrival = intake.Arrival(
        tenant=found.tenant,
        connectors=list(Connector.objects.filter(sources=found).values_list("id", "idempotent")),
        payload=payload,
        size=len(body),
        dedupe_key=key,
        source=found,
        headers=kept_headers(request.headers, found.dedupe_key),
        body=text,
    )
    outcome = intake.submit(arrival, now=now)
    refusal = intake.refusal(outcome)
    if refusal is not None:
        return _refused(found, refusal)
    if isinstance(outcome, intake.Duplicated):
        _log("hook_duplicate", found, 200, delivery=outcome.id)
        return _json({"status": "duplicate", "id": outcome.id}, 200, outcome.headers)
    commands = [command.pk for command in outcome.commands]
    _log("hook_accepted", found, 202, delivery=outcome.id, commands=len(commands), size=len(body))
    return _json({"status": "accepted", "id": outcome.id, "commands": commands}, 202, outcome.headers)


def kept_headers(headers, dedupe_key: str) -> dict[str, str]:
    """The headers a delivery keeps (``KEPT_HEADERS`` and the one the event key comes from)."""
    names = list(KEPT_HEADERS)
    resolved = event_keys.resolve(dedupe_key)
    if resolved is not None and resolved[0] == "header":
        names.append(resolved[1])
    kept = {}
    for name in names:
        value = headers.get(name)
        if value:
            kept[name] = value[:MAX_KEPT_HEADER_CHARS]
    return kept


def _json(data: dict, status: int, headers: dict[str, str]) -> JsonResponse:
    response = JsonResponse(data, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


def _refused(source: Source | None, refusal: intake.Refusal) -> JsonResponse:
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
