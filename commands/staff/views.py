"""A demo receiver for the ``http`` connector that ``manage.py demo`` creates (mounted only with DEBUG).

It answers a JSON POST with 200 and the ``Idempotency-Key`` it got, or with the status the payload
asks for (``{"respond": 503}``), so the demo can show a retry, an ``after-fix`` or a ``never``
without any outside system. It stores nothing.
"""

from __future__ import annotations

import json

from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST


@csrf_exempt
@require_POST
def demo_receiver(request):
    try:
        payload = json.loads(request.body or b"{}")
    except (ValueError, UnicodeDecodeError):
        return JsonResponse({"error": "bad_json", "detail": "The body is not JSON."}, status=400)
    key = request.headers.get("Idempotency-Key", "")
    wanted = payload.get("respond") if isinstance(payload, dict) else None
    status = wanted if isinstance(wanted, int) and 200 <= wanted <= 599 else 200
    return JsonResponse({"received": key, "status": status}, status=status)
