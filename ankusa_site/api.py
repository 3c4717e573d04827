"""What every REST endpoint shares: errors as ``{"error": code, "detail": text}``.

DRF's own handler decides the status; this reshapes its body so clients parse one shape
everywhere. Validation errors keep the per-field messages under ``fields`` as well. Paths that
no view answers (404) and server errors (500) under ``/api/`` and ``/hooks/`` get the same shape
from ``ankusa_site.urls``' handlers instead of Django's HTML pages.
"""

from __future__ import annotations

from django.http import Http404, JsonResponse
from rest_framework import exceptions
from rest_framework.views import exception_handler

JSON_PREFIXES = ("/api/", "/hooks/")


def json_errors(exc, context):
    """DRF's handler, reshaped into ``{"error": code, "detail": text}``."""
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "Not found.")
    response = exception_handler(exc, context)
    if response is None:
        return None
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        text = "; ".join(f"{name}: {' '.join(map(str, msgs))}" for name, msgs in fields.items())
        response.data = {"error": code, "detail": text, "fields": fields}
    else:
        response.data = {"error": code, "detail": str(exc.detail)}
    return response


def error(code: str, detail: str, status: int, **headers: str) -> JsonResponse:
    response = JsonResponse({"error": code, "detail": detail}, status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def wants_json(request) -> bool:
    return request.path.startswith(JSON_PREFIXES)
