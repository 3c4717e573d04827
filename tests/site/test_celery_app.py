"""The Celery app's own hooks (``ankusa_site.celery``)."""

import gc
import time

import psycopg
import pytest
from celery.signals import (
    beat_init,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_ready,
)
from django.db import OperationalError, connection, transaction

from tests.services import database_url


def test_a_prefork_pool_process_freezes_what_it_inherited_and_a_worker_in_its_own_process_does_not():
    # Sent by each pool process once forked (the default pool, as deployed). A worker whose tasks
    # run in its own process (--pool solo, or one started inside a caller's) only gets ready.
    assert gc.get_freeze_count() == 0
    try:
        worker_ready.send(sender=None)
        assert gc.get_freeze_count() == 0
        worker_process_init.send(sender=None)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def run_around_a_task(task) -> None:
    # What a worker sends before and after each task it runs.
    task_prerun.send(sender=task, task_id="t", task=task, args=(), kwargs={})
    task_postrun.send(sender=task, task_id="t", task=task, args=(), kwargs={}, retval=None, state="SUCCESS")


@pytest.mark.django_db(transaction=True)
def test_a_task_keeps_a_sound_database_connection_for_the_next_one_and_drops_an_aged_one():
    from commands.tasks import poll

    connection.ensure_connection()
    kept = connection.connection
    run_around_a_task(poll)
    assert connection.connection is kept  # Celery alone would have closed it before and after
    connection.close_at = time.monotonic() - 1  # past CONN_MAX_AGE
    run_around_a_task(poll)
    assert connection.connection is None  # the next task connects afresh


@pytest.mark.django_db(transaction=True)
def test_a_task_drops_a_postgresql_connection_the_server_broke(postgres):
    from commands.tasks import poll

    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with psycopg.connect(database_url(connection.settings_dict), autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])  # as a restart does
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # the task that met it failed
    run_around_a_task(poll)
    assert connection.connection is None
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # the next task works


@pytest.mark.django_db(transaction=True)
def test_a_task_run_eagerly_leaves_its_callers_transaction_and_connection_alone():
    from commands.tasks import poll

    with transaction.atomic():
        kept = connection.connection
        poll.push_request(is_eager=True)
        try:
            run_around_a_task(poll)
        finally:
            poll.pop_request()
        assert connection.connection is kept and not connection.needs_rollback
        assert connection.is_usable()  # the caller's transaction goes on


def test_celerys_django_fixup_keeps_connections_across_tasks_as_configured(settings):
    from celery.fixups.django import DjangoWorkerFixup

    from ankusa_site.celery import app

    fixup = DjangoWorkerFixup(app)
    assert fixup.db_reuse_max == settings.CELERY_DB_REUSE_MAX >= 100


@pytest.mark.django_db(transaction=True)
def test_a_worker_or_beat_closes_what_its_start_up_opened_but_a_callers_transaction():
    from ankusa_site.celery import close_startup_connections

    connection.ensure_connection()
    beat_init.send(sender=None)  # (worker_init would install Celery's worker fix-up in this process)
    assert connection.connection is None  # Django's system checks' connection, idle for good
    assert close_startup_connections in worker_init._live_receivers(None)  # not sent here: see above
    connection.ensure_connection()
    close_startup_connections()
    assert connection.connection is None
    with transaction.atomic():  # a worker started inside a caller's transaction
        kept = connection.connection
        close_startup_connections()
        assert connection.connection is kept and connection.is_usable()
