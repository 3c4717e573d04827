"""What the site's endpoints for machines outside the REST API share (``/healthz``, ``/readyz``,
``/metrics``): GET and HEAD only, and every other answer JSON.

Django's ``require_GET`` refused a load balancer's ``HEAD`` probe with an HTML 405, and a POST met
the CSRF check first: an HTML 403.
"""

from __future__ import annotations

import functools

from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt

from ankusa_site.core.answers import error

METHODS = ("GET", "HEAD")


def probe(view):
    """``view`` for GET and HEAD (never cached); any other method a JSON 405 naming the allowed."""

    @csrf_exempt
    @never_cache
    @functools.wraps(view)
    def answered(request, *args, **kwargs):
        if request.method not in METHODS:
            detail = f"{request.method} is not allowed here; use GET or HEAD."
            return error("method_not_allowed", detail, 405, Allow=", ".join(METHODS))
        return view(request, *args, **kwargs)

    return answered
