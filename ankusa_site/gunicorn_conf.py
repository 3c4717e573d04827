"""gunicorn settings shared by ``manage.py serve`` and the deploy units (``-c python:ankusa_site.gunicorn_conf``).

With ``PROMETHEUS_MULTIPROC_DIR`` set, a worker that exits leaves its metric files behind; this
tells prometheus-client it is gone so its live gauges (the fleet breaker state) stop being
reported. Its counters stay summed in, as they should: what it counted happened.
"""

import os


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
