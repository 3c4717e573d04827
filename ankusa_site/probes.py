"""What the site's endpoints for machines outside the REST API share (``/healthz``, ``/readyz``,
``/metrics``): GET and HEAD only, and every other answer JSON.

Django's ``require_GET`` refused a load balancer's ``HEAD`` probe with an HTML 405, and a POST met
the CSRF check first: an HTML 403. This module imports nothing of DRF (the stores import
``ankusa_site.metrics`` before DRF may load its settings).
"""

from __future__ import annotations

import functools

from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

METHODS = ("GET", "HEAD")


def probe(view):
    """``view`` for GET and HEAD (never cached); any other method a JSON 405 naming the allowed."""

    @csrf_exempt
    @never_cache
    @functools.wraps(view)
    def answered(request, *args, **kwargs):
        if request.method not in METHODS:
            response = JsonResponse(
                {
                    "error": "method_not_allowed",
                    "detail": f"{request.method} is not allowed here; use GET or HEAD.",
                },
                status=405,
            )
            response["Allow"] = ", ".join(METHODS)
            return response
        return view(request, *args, **kwargs)

    return answered
