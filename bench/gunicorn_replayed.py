"""The deployed gunicorn settings (``ankusa_site.gunicorn_conf``) with, in each worker, the intake's
round trips that ``BENCH_REPLAY`` names (``store``, ``statement``, comma-separated) answered in the
process (``bench/replay.py``): the servers of ``bench/intake.py --without-waits``."""

import os

from ankusa_site import gunicorn_conf
from ankusa_site.gunicorn_conf import *  # noqa: F403 - every deployed setting and hook, then ours


def post_worker_init(worker):  # type: ignore[no-redef]  # the deployed hook's, then the replay
    from bench.replay import install

    gunicorn_conf.post_worker_init(worker)
    install(os.environ["BENCH_REPLAY"].split(","))  # for the worker's life
