"""The Celery app's own hooks (``ankusa_site.celery``)."""

import gc

from celery.signals import worker_process_init, worker_ready


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
