"""The deployed gunicorn settings (``ankusa_site.gunicorn_conf``), each worker serving with Django's
own ``WSGIHandler`` instead of the site's (``ankusa_site.handlers``, whose webhooks skip the URL
resolver and the middleware they need none of): the baseline that shortcut is measured against,

    .venv/bin/python bench/intake_ab.py --baseline bench.gunicorn_django_handler
"""

from ankusa_site.gunicorn_conf import *  # noqa: F403 - every deployed setting and hook, then ours
from ankusa_site.gunicorn_conf import post_worker_init as _deployed_post_worker_init


def post_worker_init(worker):  # type: ignore[no-redef]  # the deployed hook replaced
    from django.core.handlers.wsgi import WSGIHandler

    worker.wsgi = WSGIHandler()  # the site's urlconf and middleware, Django's way through them
    _deployed_post_worker_init(worker)
