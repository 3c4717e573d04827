"""The deployed gunicorn settings (``ankusa_site.gunicorn_conf``) without its ``gc.freeze`` in each
worker: the baseline ``bench/intake_ab.py`` compares the freeze with by default."""

from ankusa_site.gunicorn_conf import *  # noqa: F403 - every deployed setting and hook, then ours


def post_worker_init(worker):  # type: ignore[no-redef]  # the deployed hook replaced
    pass  # gunicorn's own: nothing frozen
