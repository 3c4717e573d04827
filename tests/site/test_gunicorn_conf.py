"""The gunicorn settings every server runs with (``ankusa_site.gunicorn_conf``)."""

import gc
import weakref

from ankusa_site import gunicorn_conf


class Cycle:
    def __init__(self):
        self.me = self


def test_a_worker_freezes_what_it_loaded_and_still_collects_what_it_makes_later():
    loaded = Cycle()
    loaded_ref = weakref.ref(loaded)
    try:
        gunicorn_conf.post_worker_init(worker=None)
        assert gc.get_freeze_count() > 0
        del loaded
        gc.collect()
        assert loaded_ref() is not None  # frozen: never walked, never collected

        served = Cycle()
        served_ref = weakref.ref(served)
        del served
        gc.collect()
        assert served_ref() is None
    finally:
        gc.unfreeze()
        gc.collect()
    assert loaded_ref() is None


def test_a_worker_collects_the_garbage_of_loading_before_it_freezes():
    garbage = Cycle()
    garbage_ref = weakref.ref(garbage)
    del garbage  # unreachable already: the hook's own collection takes it
    try:
        gunicorn_conf.post_worker_init(worker=None)
        assert garbage_ref() is None
    finally:
        gc.unfreeze()
