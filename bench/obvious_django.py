"""The peer ``bench/intake.py`` measures the intake against: the webhook receiver a Django team
would write without Ankusa, on the same models, database, Redis and gunicorn.

``POST /bench/obvious/<tenant>/<source>/`` (mounted by ``bench/intake_server.py`` only, never in the
product's URLs): a DRF ``APIView`` that reads the source with its tenant, verifies GitHub's
``X-Hub-Signature-256`` against the source's secrets, rate-limits the tenant with
``django-ratelimit`` on the site's Redis cache (``CACHES["redis"]``: the same Redis as the fleet
store), and in one ``transaction.atomic()`` does ``get_or_create`` on the delivery
(``X-GitHub-Delivery`` as its event key) and, for a new one, creates its commands (``queued``) and
their queue items through the ORM. Answers as the intake does: 202 with the delivery's id, 200 for
a duplicate, 401, 404, 429.

Written the obvious way on purpose — the documented API of each library, no caching, no raw SQL —
so the ratio says what Ankusa's intake costs against what a team would otherwise run. Not a
product path: it keeps no claim (a concurrent duplicate is left to the unique constraint, which
``get_or_create`` turns into a read), and its queue positions are the command ids.
"""

from __future__ import annotations

import hashlib
import hmac

from django.db import transaction
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django.utils.decorators import method_decorator
from django_ratelimit.decorators import ratelimit
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from commands.models import Command, Delivery, Source
from commands.states import State
from queues.models import QueueItem

# High enough that the benchmark's rounds never reach it: the check is measured, not the refusals
# (the bench tenant is unlimited in Ankusa's intake too).
RATE = "1000000/m"


def _tenant(group, request) -> str:
    return request.resolver_match.kwargs["tenant"]


class ObviousWebhook(APIView):
    authentication_classes: list = []
    permission_classes: list = []
    parser_classes = [JSONParser]

    @method_decorator(ratelimit(key=_tenant, rate=RATE, group="bench-obvious-hooks", block=False))
    def post(self, request, tenant: str, source: str):
        found = get_object_or_404(
            Source.objects.select_related("tenant"), tenant__slug=tenant, tenant__active=True, slug=source
        )
        body = request.body
        sent = request.headers.get("X-Hub-Signature-256", "")
        if not any(
            hmac.compare_digest(sent, "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest())
            for secret in found.verifier_secrets
        ):
            return Response({"error": "bad_signature"}, status=401)
        if getattr(request, "limited", False):
            return Response({"error": "rate_limited"}, status=429, headers={"Retry-After": "1"})
        event = request.headers.get("X-GitHub-Delivery", "")
        payload = request.data
        now = timezone.now()
        with transaction.atomic():
            delivery, created = Delivery.objects.get_or_create(
                tenant=found.tenant,
                source=found,
                event_key=event,
                defaults={"body": body.decode(), "size": len(body), "received_at": now},
            )
            if not created:
                return Response({"status": "duplicate", "id": delivery.pk}, status=200)
            commands = []
            for connector in found.connectors.all():
                command = Command.objects.create(
                    tenant=found.tenant,
                    connector=connector,
                    source=found,
                    delivery=delivery,
                    idempotency_key=event,
                    payload=payload,
                    state=State.QUEUED,
                    state_changed_at=now,
                    created_at=now,
                )
                QueueItem.objects.create(
                    queue="commands",
                    position=command.pk,
                    payload={"command": command.pk, "attempt": 1},
                    enqueued_at=now,
                )
                commands.append(command.pk)
        return Response({"status": "accepted", "id": delivery.pk, "commands": commands}, status=202)
