"""gunicorn settings shared by ``manage.py serve`` and the deploy units (``-c python:ankusa_site.gunicorn_conf``).

With ``PROMETHEUS_MULTIPROC_DIR`` set, a worker that exits leaves its metric files behind; this
tells prometheus-client it is gone so its live gauges (the fleet breaker state) stop being
reported. Its counters stay summed in, as they should: what it counted happened.

Each worker, once it has loaded the site, moves every object alive then (modules, the URL
resolver, models, settings: hundreds of thousands of them) out of the cyclic garbage collector's
sight (``gc.freeze``). They live as long as the worker does, yet each collection of the oldest
generation walked them all again: ``perf`` under the intake benchmark put the collector at about
6 % of the machine's busy CPU. Garbage made while serving is collected as before.
"""

import gc
import os


def post_worker_init(worker):
    gc.collect()  # what loading left as garbage goes now, not frozen with the rest
    gc.freeze()


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
