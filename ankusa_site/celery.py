"""The Celery app: an alternative runner for the dispatch loop (``manage.py dispatch`` needs none).

Configuration comes from Django settings under the ``CELERY_`` prefix; the broker is Redis
(``CELERY_BROKER_URL``, default ``REDIS_URL``). Tasks live in each app's ``tasks.py``. Each process
of the prefork pool (the default, as deployed) freezes what it inherited and loaded once forked
(``ankusa_site.core.longlived``); a worker that runs tasks in its own process (``--pool solo`` or
``threads``, or one started inside a caller's) freezes nothing.
"""

import os

from celery import Celery
from celery.signals import beat_init, task_postrun, task_prerun, worker_init, worker_process_init
from django.db import close_old_connections, connections

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


@worker_init.connect
@beat_init.connect
def close_startup_connections(**kwargs) -> None:
    # What start-up opened (Django's system checks), held idle for the process's life otherwise: a
    # prefork worker's own process runs no task, beat none at all, and Celery's fix-up, told to keep
    # connections (CELERY_DB_REUSE_MAX), no longer closes them here. A worker started inside a
    # caller's transaction (an embedded one) leaves that transaction's connection alone.
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close()


@task_prerun.connect
@task_postrun.connect
def close_old_task_connections(task=None, **kwargs) -> None:
    # As Django does around each request, and the dispatch loop around each drain: a connection
    # that broke or aged out (CONN_MAX_AGE) is dropped, the others kept for the next task. Celery's
    # own habit, a new connection for every task (CELERY_DB_REUSE_MAX in the settings), cost a
    # poll asked by a wake more than the rest of its drain (bench/README.md, *Celery sending*). A
    # task run eagerly runs inside its caller's request or transaction: left alone.
    if task is not None and not getattr(task.request, "is_eager", False):
        close_old_connections()
