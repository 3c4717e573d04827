"""The deployed gunicorn settings (``ankusa_site.gunicorn_conf``) without its ``gc.freeze`` in each
worker: the baseline ``bench/intake_ab.py`` compares the freeze with by default."""

from ankusa_site.gunicorn_conf import child_exit  # noqa: F401 - gunicorn reads the module's hooks
