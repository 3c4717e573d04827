"""The WSGI app that ``bench/intake.py`` serves with gunicorn: the whole site, plus a bare Django view
and the obvious Django receiver (``bench/obvious_django.py``, ``POST /bench/obvious/<tenant>/<source>/``,
rate-limited by django-ratelimit on the site's Redis cache).

The bare view (``POST /bench/bare/``) is the benchmark's baseline: the same server, workers,
handler (``ankusa_site.handlers``: the whole middleware stack, which a webhook takes in part) and
body read as a webhook, and nothing else. It is mounted here only — this
module is its own URLconf, set before the first request — never in the product's URLs.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")

from ankusa_site.wsgi import application  # noqa: E402, F401, I001 - first: it sets Django up

from django.conf import settings  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from ankusa_site import urls as site_urls  # noqa: E402
from bench.obvious_django import ObviousWebhook  # noqa: E402


@csrf_exempt
def bare(request):
    return JsonResponse({"status": "accepted", "size": len(request.body)}, status=202)


urlpatterns = [
    path("bench/bare/", bare),
    path("bench/obvious/<str:tenant>/<str:source>/", ObviousWebhook.as_view()),
    *site_urls.urlpatterns,
]
handler400, handler404, handler500 = site_urls.handler400, site_urls.handler404, site_urls.handler500
settings.ROOT_URLCONF = __name__
settings.RATELIMIT_USE_CACHE = "redis"  # django-ratelimit on the same Redis as the fleet store
