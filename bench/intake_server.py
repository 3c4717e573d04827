"""The WSGI app that ``bench/intake.py`` serves with gunicorn: the whole site, plus a bare Django view
and the obvious Django receiver (``bench/obvious_django.py``, ``POST /bench/obvious/<tenant>/<source>/``,
rate-limited by django-ratelimit on the site's Redis cache).

The bare view (``POST /bench/bare/``) is the benchmark's baseline: the same server, workers,
handler (``ankusa_site.handlers``: the whole middleware stack, which a webhook takes in part) and
body read as a webhook, and nothing else. The durable floor (``POST /bench/floor/``) is the bare
view plus the least a receiver that keeps what it accepts must do before its 2xx: one ``INSERT``
of the body into a table with nothing but its key (``FLOOR_TABLE``, made by ``bench/intake.py``),
committed — prepared on PostgreSQL, as the intake's statement is. No verification, no quota, no
dedupe, no queue. Both are mounted here only — this module is its own URLconf, set before the first
request — never in the product's URLs.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")

from ankusa_site.wsgi import application  # noqa: E402, F401, I001 - first: it sets Django up

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.http import JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from django.views.decorators.csrf import csrf_exempt  # noqa: E402

from ankusa_site import urls as site_urls  # noqa: E402
from ankusa_site.core.prepared import execute_prepared  # noqa: E402
from bench.obvious_django import ObviousWebhook  # noqa: E402


@csrf_exempt
def bare(request):
    return JsonResponse({"status": "accepted", "size": len(request.body)}, status=202)


FLOOR_TABLE = "bench_durable_floor"
FLOOR_INSERT = f"INSERT INTO {FLOOR_TABLE} (body) VALUES (%s) RETURNING id"


@csrf_exempt
def floor(request):
    body = request.body.decode("utf-8", "replace")
    if connection.vendor == "postgresql":  # outside a transaction: the statement commits by itself
        ((pk,),), _ = execute_prepared(connection, FLOOR_INSERT, [body])
    else:
        with connection.cursor() as cursor:
            cursor.execute(FLOOR_INSERT, [body])
            (pk,) = cursor.fetchone()
    return JsonResponse({"status": "accepted", "id": pk}, status=202)


urlpatterns = [
    path("bench/bare/", bare),
    path("bench/floor/", floor),
    path("bench/obvious/<str:tenant>/<str:source>/", ObviousWebhook.as_view()),
    *site_urls.urlpatterns,
]
handler400, handler404, handler500 = site_urls.handler400, site_urls.handler404, site_urls.handler500
settings.ROOT_URLCONF = __name__
settings.RATELIMIT_USE_CACHE = "redis"  # django-ratelimit on the same Redis as the fleet store
