"""The site's error answer, ``{"error": code, "detail": text}``, for code that answers outside DRF:
middleware, the probes, the URL fallbacks and Django's error handlers. It imports nothing of DRF,
so modules loaded before DRF reads its settings (the metrics, which the stores import) can use it.
"""

from __future__ import annotations

from django.http import JsonResponse

# Paths whose every answer, an error included, is JSON: the REST API and the webhooks.
JSON_PREFIXES = ("/api/", "/hooks/")


def error(code: str, detail: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": code, "detail": detail}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def wants_json(request) -> bool:
    return request.path.startswith(JSON_PREFIXES)
