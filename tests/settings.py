"""Settings for the test suite: the site's own, pointed at test-only Redis and databases.

Tests take Redis database ``ANKUSA_TEST_REDIS_DB`` (default 15) on the host ``REDIS_URL`` names,
never the site's own database number, because the fixtures flush it around every test. Two
checkouts testing at once on one machine give each a different number.
"""

import os

os.environ.setdefault("SECRET_KEY", "tests-only-not-a-secret-" + "x" * 32)

from urllib.parse import urlsplit, urlunsplit  # noqa: E402

from ankusa_site.env import env_int, env_networks  # noqa: E402
from ankusa_site.settings import *  # noqa: E402

TEST_REDIS_DB = env_int("ANKUSA_TEST_REDIS_DB", 15, minimum=0, maximum=15)


def _with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


REDIS_URL = _with_db(REDIS_URL, TEST_REDIS_DB)
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
