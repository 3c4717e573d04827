"""The deployed gunicorn settings (``ankusa_site.gunicorn_conf``) with gunicorn's own threaded
worker, which accepts new connections while every thread is busy, instead of the site's
(``ankusa_site.gunicorn_worker``): the baseline that worker is measured against,

    .venv/bin/python bench/intake_ab.py --baseline bench.gunicorn_stock_worker
"""

from ankusa_site.gunicorn_conf import *  # noqa: F403 - every deployed setting and hook, then ours

worker_class = "gthread"
