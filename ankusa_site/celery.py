"""The Celery app: an alternative runner for the dispatch loop (``manage.py dispatch`` needs none).

Configuration comes from Django settings under the ``CELERY_`` prefix; the broker is Redis
(``CELERY_BROKER_URL``, default ``REDIS_URL``). Tasks live in each app's ``tasks.py``. Each process
of the prefork pool (the default, as deployed) freezes what it inherited and loaded once forked
(``ankusa_site.core.longlived``); a worker that runs tasks in its own process (``--pool solo`` or
``threads``, or one started inside a caller's) freezes nothing.
"""

import os

from celery import Celery
from celery.signals import worker_process_init

from ankusa_site.core.longlived import freeze_startup

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")

app = Celery("ankusa")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_process_init.connect
def freeze_pool_process(**kwargs) -> None:
    # A pool process is always a process of its own, made to run tasks: its start-up objects out of
    # the collector's sight, as the dispatch loop's and gunicorn's workers'.
    freeze_startup()
