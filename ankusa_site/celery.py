"""The Celery app: an alternative runner for the dispatch loop (``manage.py dispatch`` needs none).

Configuration comes from Django settings under the ``CELERY_`` prefix; the broker is Redis
(``CELERY_BROKER_URL``, default ``REDIS_URL``). Tasks live in each app's ``tasks.py``.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")

app = Celery("ankusa")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
