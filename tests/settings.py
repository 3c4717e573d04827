"""Settings for the test suite: the site's own, pointed at test-only Redis and databases.

The fixtures flush the run's Redis database around every test, so each run, and each worker of a
pytest-xdist run, takes a number of its own on the host ``REDIS_URL`` names, never 0 (the site's
own default): ``ANKUSA_TEST_REDIS_DB`` when given (to a run in one process), else the first free
one, claimed for the life of the process (``tests.redis_claim``). The number is put back into the
environment, so every subprocess of the run or worker uses the same one.
"""

import os

os.environ.setdefault("SECRET_KEY", "tests-only-not-a-secret-" + "x" * 32)

from ankusa_site.core.env import env_int, env_networks  # noqa: E402
from ankusa_site.settings import *  # noqa: E402
from ankusa_site.settings import REDIS_URL  # noqa: E402 - named, for the type checker
from tests import redis_claim  # noqa: E402

# A pytest-xdist worker inherits the number its starter claimed and takes one of its own; the
# worker's subprocesses see by ANKUSA_TEST_REDIS_DB_WORKER that the number is their worker's.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if os.environ.get("ANKUSA_TEST_REDIS_DB") and os.environ.get("ANKUSA_TEST_REDIS_DB_WORKER", "") == _WORKER:
    TEST_REDIS_DB = env_int("ANKUSA_TEST_REDIS_DB", 15, minimum=1, maximum=15)
    # Held (unless the run that started this process holds it) so no other run claims it.
    _REDIS_CLAIM = redis_claim.hold(REDIS_URL, TEST_REDIS_DB)
else:
    _REDIS_CLAIM = redis_claim.claim(REDIS_URL)
    TEST_REDIS_DB = _REDIS_CLAIM.db
    os.environ["ANKUSA_TEST_REDIS_DB"] = str(TEST_REDIS_DB)
    os.environ["ANKUSA_TEST_REDIS_DB_WORKER"] = _WORKER

REDIS_URL = redis_claim.with_db(REDIS_URL, TEST_REDIS_DB)
CACHES["redis"]["LOCATION"] = REDIS_URL
CELERY_BROKER_URL = REDIS_URL

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES["staticfiles"] = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
# Serve static files from the apps' folders (no collectstatic before a test run).
STATIC_ROOT = None
WHITENOISE_USE_FINDERS = True
# The tests' receivers listen on loopback; the egress tests narrow this again where they need to.
ANKUSA_CONNECTOR_ALLOWED_NETWORKS = env_networks(
    "ANKUSA_CONNECTOR_ALLOWED_NETWORKS", ["127.0.0.0/8", "::1/128"]
)
