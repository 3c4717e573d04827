"""Ankusa's settings, all read from the environment (the README lists every variable).

The defaults give a working embedded setup: SQLite under ``var/``, the node-local quota store,
the database queue, no Redis needed. Past one machine the same code runs on PostgreSQL and Redis
by setting ``DATABASE_URL``, ``ANKUSA_STORE_SCOPE=fleet`` and ``ANKUSA_QUEUE_BACKEND=redis``.

Every value goes through ``ankusa_site.core.env``, which raises ``ImproperlyConfigured`` naming the
variable, so a typo fails the boot. Rules that span several settings are system checks
(``ankusa_site.checks``). Nothing here connects to anything: Redis and the database are reached
lazily, so an outage never blocks start-up.
"""

from __future__ import annotations

import math
import secrets
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from ankusa_site.core import stock
from ankusa_site.core.env import (
    env_bool,
    env_choice,
    env_database,
    env_float,
    env_int,
    env_list,
    env_mapping,
    env_networks,
    env_redis_url,
    env_str,
)
from ankusa_site.core.varfiles import private_dir, write_private

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("ANKUSA_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)


def _local_secret_key() -> str:
    """A key generated once into ``var/`` so local sessions survive restarts; never in production."""
    path = VAR_DIR / "secret_key"
    if not path.exists():
        write_private(private_dir(VAR_DIR) / "secret_key", secrets.token_urlsafe(50))
    return path.read_text().strip()


SECRET_KEY = env_str("SECRET_KEY", "") or (_local_secret_key() if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY is required when DEBUG is off (set DEBUG=1 for a local key in var/)."
    )

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

# --- HTTPS (behind a proxy that terminates TLS: deploy/nginx/ankusa.conf) -------------------------

# One switch, because the settings it turns on only make sense together: a site served over HTTPS
# redirects plain HTTP to it, tells browsers to come back over HTTPS only (HSTS), sends its session
# and CSRF cookies over HTTPS only, and believes the proxy's X-Forwarded-Proto. That header reaches
# the site only from ANKUSA_TRUSTED_PROXIES: gunicorn drops it from any other peer (gunicorn_conf).
ANKUSA_HTTPS = env_bool("ANKUSA_HTTPS", False)
SECURE_SSL_REDIRECT = ANKUSA_HTTPS
# Probes and scrapers are often pointed at a node's plain HTTP port; a redirect is not an answer.
SECURE_REDIRECT_EXEMPT = [r"^healthz/?$", r"^readyz/?$", r"^metrics/?$"]
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if ANKUSA_HTTPS else None
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = ANKUSA_HTTPS
# A year, what the HSTS preload list asks for; a browser that saw it keeps to HTTPS that long.
SECURE_HSTS_SECONDS = env_int("ANKUSA_HSTS_SECONDS", 365 * 24 * 3600 if ANKUSA_HTTPS else 0, minimum=0)
# Whether the domain's other hosts are HTTPS-only too, and whether to ask for the preload list, are
# the domain owner's decisions (Ankusa usually runs on one host of a larger domain): both off unless
# set, so check --deploy's reminders about them (W005, W021) are silenced.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("ANKUSA_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("ANKUSA_HSTS_PRELOAD", False)
SILENCED_SYSTEM_CHECKS = ["security.W005", "security.W021"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "ankusa_site",
    "limits",
    "queues",
    "commands",
]

MIDDLEWARE = [
    "ankusa_site.core.middleware.body_timeout",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "ankusa_site.core.middleware.chunked_body",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "ankusa_site.urls"
WSGI_APPLICATION = "ankusa_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Which fast paths run Django's stock way instead (ankusa_site.core.stock): none by default.
ANKUSA_STOCK_DJANGO = stock.parse(env_str("ANKUSA_STOCK_DJANGO", "0"))
DATABASES = {
    "default": stock.stock_engine(
        env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'ankusa.sqlite3'}", base_dir=BASE_DIR),
        ANKUSA_STOCK_DJANGO,
    ),
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # SQLite creates its file but not the folder; a fresh clone has no var/ yet. A folder that
    # cannot be made is left for the database check (/healthz) to report, not a boot failure.
    # The site's own folder is owner-only (ankusa_site.core.varfiles); a folder named elsewhere is left
    # as its owner made it. The backend creates the file itself owner-only.
    for _name in (DATABASES["default"]["NAME"], DATABASES["default"]["TEST"]["NAME"]):
        try:
            _folder = Path(_name).parent
            private_dir(_folder) if _folder == VAR_DIR else _folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass

# Redis is reached only when a feature asks for it (fleet store, Redis queue, Celery broker).
REDIS_URL = env_redis_url("REDIS_URL", "redis://127.0.0.1:6379/0")
REDIS_CONFIGURED = bool(env_str("REDIS_URL", ""))
# Socket timeouts of the shared connection pool. The fleet store's own budget
# (ANKUSA_STORE_TIMEOUT_MS) is tighter and is enforced per call by the store itself.
REDIS_SOCKET_TIMEOUT_S = env_float("ANKUSA_REDIS_SOCKET_TIMEOUT_S", 2.0, minimum=0.01)

CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "redis": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {
            "SOCKET_CONNECT_TIMEOUT": REDIS_SOCKET_TIMEOUT_S,
            "SOCKET_TIMEOUT": REDIS_SOCKET_TIMEOUT_S,
            "CONNECTION_POOL_KWARGS": {"max_connections": 64},
        },
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# One way to write a time in the console, with its zone: 2026-12-01 13:28:01 UTC.
FORMAT_MODULE_PATH = ["ankusa_site.formats"]

STATIC_URL = "/static/"
STATIC_ROOT = VAR_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# Bodies are bounded by the intake itself (per tenant); this caps everything else.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("ANKUSA_MAX_REQUEST_BYTES", 10 * 1024 * 1024, minimum=1024)

# Our own Bearer tokens (limits.tokens) and the admin's session; DRF's authtoken is not used, so a
# second, unhashed kind of token cannot exist. Who may do what: limits.permissions.ApiPermission.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "limits.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["limits.permissions.ApiPermission"],
    "DEFAULT_PARSER_CLASSES": ["ankusa_site.core.parsers.JSONParser"],
    # JSON only: no browsable API, whose pages would answer an error as HTML.
    "DEFAULT_RENDERER_CLASSES": ["ankusa_site.core.renderers.JSONRenderer"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_FILTER_BACKENDS": ["ankusa_site.core.api.StrictFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "ankusa_site.core.api.Cursor",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "ankusa_site.core.api.json_errors",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Ankusa API",
    "DESCRIPTION": "Commands in, quotas held, duplicates refused, dispatch visible.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and its pages are public: they describe the API, they hold no data.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "COMPONENT_SPLIT_REQUEST": True,  # write-only secrets appear in requests, never in responses
    # Two choice sets share the name skip_reason: the stored reason, and the wider "why it waits"
    # that the list filters by (after-fix, resend-pending, none besides the stored ones).
    "ENUM_NAME_OVERRIDES": {
        "OutlookEnum": "commands.retry.Outlook",
        "SkipReasonEnum": "commands.retry.SkipReason",
        "WaitsForEnum": "commands.staff.api_command_io.WAIT_CHOICES",
        "SendingStateEnum": "commands.staff.api_pause.SENDING_STATES",
        "CommandStateEnum": "commands.states.State",
    },
    # Every operation also declares the JSON errors any of them may answer (400/401/403/404/415).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "ankusa_site.schema.add_common_errors",
    ],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# --- limits: quotas and claims (DESIGN.md § limits) ----------------------------------------------

# node: this process's memory. fleet: Redis shared by every node, falling back to node for a call
# Redis does not answer within ANKUSA_STORE_TIMEOUT_MS.
ANKUSA_STORE_SCOPE = env_choice("ANKUSA_STORE_SCOPE", "node", ("node", "fleet"))
# A hard per-call budget, not a hint: a webhook's answer should not wait on a sick Redis.
ANKUSA_STORE_TIMEOUT_MS = env_int("ANKUSA_STORE_TIMEOUT_MS", 50, minimum=1, maximum=10_000)
# 72 h covers Stripe's 3-day and Shopify's 48-hour retry schedules.
ANKUSA_CLAIM_TTL_MS = env_int("ANKUSA_CLAIM_TTL_MS", 72 * 3600 * 1000, minimum=1000)
# A holder commits in milliseconds; 30 s is long enough that a slow commit is not overtaken and
# short enough that a provider's first retry after a crashed node is accepted.
ANKUSA_CLAIM_PENDING_TTL_MS = env_int("ANKUSA_CLAIM_PENDING_TTL_MS", 30_000, minimum=100)
# With the fleet store, settle a webhook's claim after its 202 (batched per process: one round trip
# for many) rather than before it (limits.store.settling). Off: settled before the answer.
ANKUSA_SETTLE_AFTER_ANSWER = env_bool("ANKUSA_SETTLE_AFTER_ANSWER", True)
# After this many consecutive fleet failures the breaker opens and calls go straight to the
# node store for ANKUSA_FLEET_BREAKER_COOLDOWN_MS, then one call probes Redis again.
ANKUSA_FLEET_BREAKER_THRESHOLD = env_int("ANKUSA_FLEET_BREAKER_THRESHOLD", 3, minimum=1)
ANKUSA_FLEET_BREAKER_COOLDOWN_MS = env_int("ANKUSA_FLEET_BREAKER_COOLDOWN_MS", 2000, minimum=10)

# Site default limits, used for a tenant with none of its own. Unset means unlimited.
ANKUSA_DEFAULT_HOOKS_RATE = env_float("ANKUSA_DEFAULT_HOOKS_RATE", 0.0, minimum=0) or None
ANKUSA_DEFAULT_HOOKS_BURST = env_int("ANKUSA_DEFAULT_HOOKS_BURST", 0, minimum=0) or None
ANKUSA_DEFAULT_BYTES_RATE = env_float("ANKUSA_DEFAULT_BYTES_RATE", 0.0, minimum=0) or None
ANKUSA_DEFAULT_BYTES_BURST = env_int("ANKUSA_DEFAULT_BYTES_BURST", 0, minimum=0) or None
# The largest webhook body a tenant may send unless its own limit says otherwise.
ANKUSA_MAX_BODY_BYTES = env_int("ANKUSA_MAX_BODY_BYTES", 1024 * 1024, minimum=1)

# --- queues (DESIGN.md § queues) -----------------------------------------------------------------

ANKUSA_QUEUE_BACKEND = env_choice("ANKUSA_QUEUE_BACKEND", "database", ("database", "redis"))
# Per queue name, overriding the default: "commands=redis".
ANKUSA_QUEUE_BACKENDS = env_mapping("ANKUSA_QUEUE_BACKENDS", ("database", "redis"))
ANKUSA_QUEUE_REQUEUE_LIMIT = env_int("ANKUSA_QUEUE_REQUEUE_LIMIT", 5, minimum=0)

# --- dispatch (DESIGN.md § commands) -------------------------------------------------------------

# The loop's period equals the first backoff step (30 s), so a retry never waits a whole extra round.
ANKUSA_DISPATCH_INTERVAL_S = env_float("ANKUSA_DISPATCH_INTERVAL_S", 30.0, minimum=0.1)
# Between rounds, the loop (and Celery beat) looks this often for items waiting on the queue and
# drains them: intake queues the commands it accepts itself, and they should not wait for a round.
ANKUSA_DISPATCH_POLL_S = env_float("ANKUSA_DISPATCH_POLL_S", 1.0, minimum=0.05)
ANKUSA_DISPATCH_BATCH = env_int("ANKUSA_DISPATCH_BATCH", 100, minimum=1, maximum=10_000)
# Senders wait on receivers and hold no database connection: a receiver answering in a second gets
# tens of sends a second from one dispatch process by default.
ANKUSA_DISPATCH_CONCURRENCY = env_int("ANKUSA_DISPATCH_CONCURRENCY", 64, minimum=1, maximum=2000)
ANKUSA_DISPATCH_PER_CONNECTOR = env_int("ANKUSA_DISPATCH_PER_CONNECTOR", 40, minimum=1, maximum=2000)
# A bulk resend's due times are spread at this many commands per second, with jitter.
ANKUSA_RESEND_PER_S = env_float("ANKUSA_RESEND_PER_S", 10.0, minimum=0.01, maximum=10_000)
# Outage hold (commands.hold): a connector whose receiver answers `again` this many sends in a row
# (0: never), the run started within the window, holds; one probe goes out every interval, doubling
# up to ten times it, and the first success releases the waiting commands at ANKUSA_RESEND_PER_S.
ANKUSA_HOLD_AFTER_FAILURES = env_int("ANKUSA_HOLD_AFTER_FAILURES", 10, minimum=0, maximum=1_000_000)
ANKUSA_HOLD_WINDOW_S = env_float("ANKUSA_HOLD_WINDOW_S", 600.0, minimum=1)
ANKUSA_HOLD_PROBE_S = env_float("ANKUSA_HOLD_PROBE_S", 30.0, minimum=0.1)
ANKUSA_HTTP_CONNECT_TIMEOUT_S = env_float("ANKUSA_HTTP_CONNECT_TIMEOUT_S", 5.0, minimum=0.01)
ANKUSA_HTTP_READ_TIMEOUT_S = env_float("ANKUSA_HTTP_READ_TIMEOUT_S", 30.0, minimum=0.01)
# Networks a connector may reach although they are not public (commands.dispatch.adapters.egress): empty,
# so a connector can reach neither this host nor its private network unless an installation says so.
ANKUSA_CONNECTOR_ALLOWED_NETWORKS = env_networks("ANKUSA_CONNECTOR_ALLOWED_NETWORKS", [])
# An item claimed longer ago than this is presumed abandoned by a dead worker and recovered. By
# default a whole send by the site's timeouts (connect + read) and 10 s to record it: a killed
# dispatcher's work comes back that soon. A connector with longer timeouts of its own needs it raised.
ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S = env_int(
    "ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S",
    math.ceil(ANKUSA_HTTP_CONNECT_TIMEOUT_S + ANKUSA_HTTP_READ_TIMEOUT_S) + 10,
    minimum=1,
)
# How often the loop (and Celery beat) looks for expired items and lost sends, apart from rounds.
ANKUSA_DISPATCH_RECOVER_S = env_float("ANKUSA_DISPATCH_RECOVER_S", 2.0, minimum=0.1)

# --- intake (DESIGN.md § Flow) -------------------------------------------------------------------

# How long a node keeps a webhook source's configuration (verifier, connectors, the tenant's limits)
# before reading it again: a second saves two or three queries per webhook under load, and an edit
# in the admin reaches every node within it. 0 reads it for every request.
ANKUSA_INTAKE_CACHE_S = env_float("ANKUSA_INTAKE_CACHE_S", 1.0, minimum=0)
# How long a request may take to send its body once its headers arrived (under gunicorn): past it
# the answer is 408 and the connection reads no more, so clients that trickle their bodies cannot
# hold every thread of a node (ankusa_site/core/middleware.py).
ANKUSA_BODY_TIMEOUT_S = env_float("ANKUSA_BODY_TIMEOUT_S", 10.0, minimum=0.01, maximum=3600)

# --- Celery (optional: `manage.py dispatch` needs none of it) ------------------------------------

CELERY_BROKER_URL = env_redis_url("CELERY_BROKER_URL", REDIS_URL)
# The site dispatches with Celery workers: a commit that queues commands (or makes them due) asks
# for the poll task on commit, so a worker drains at once instead of at beat's next poll.
ANKUSA_DISPATCH_CELERY_WAKE = env_bool("ANKUSA_DISPATCH_CELERY_WAKE", False)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes every database connection before and after each task unless this is
# set; set, it closes them once every this many tasks of a process, and in between a task's
# connections live as a request's do (ankusa_site/celery.py: CONN_MAX_AGE, errors, health checks).
CELERY_DB_REUSE_MAX = 1000
# Celery beat runs the dispatch loop's sweep at the loop's own period and its recovery at the
# loop's recovery period; each of them asks for a consume when it queued something (commands/tasks.py). Beat also sends a poll every
# poll period, for what intake queued itself: one poll drains at a time, and a poll no worker has
# started within ten periods (at least 10 s, clocks may differ) is dropped when one receives it.
CELERY_BEAT_SCHEDULE = {
    "commands-sweep": {"task": "commands.sweep", "schedule": ANKUSA_DISPATCH_INTERVAL_S},
    "commands-recover": {"task": "commands.recover", "schedule": ANKUSA_DISPATCH_RECOVER_S},
    "commands-poll": {
        "task": "commands.poll",
        "schedule": ANKUSA_DISPATCH_POLL_S,
        "options": {"expires": max(10 * ANKUSA_DISPATCH_POLL_S, 10.0)},
    },
    "commands-prune": {"task": "commands.prune", "schedule": 3600.0},
}

# --- retention (manage.py prune, and Celery beat hourly) ------------------------------------------

# Finished (succeeded/cancelled) commands and their attempts: a month covers disputes and reports.
ANKUSA_RETAIN_COMMANDS_DAYS = env_int("ANKUSA_RETAIN_COMMANDS_DAYS", 30, minimum=1)
# Deliveries whose commands are gone; always longer than the 72 h dedupe claims anyway.
ANKUSA_RETAIN_DELIVERIES_DAYS = env_int("ANKUSA_RETAIN_DELIVERIES_DAYS", 30, minimum=4)
# Who did what to which command: a year, for audits.
ANKUSA_RETAIN_AUDIT_DAYS = env_int("ANKUSA_RETAIN_AUDIT_DAYS", 365, minimum=1)

# --- metrics ----------------------------------------------------------------------------------

# /metrics answers loopback, and anyone presenting this token as "Authorization: Bearer <token>".
ANKUSA_METRICS_TOKEN = env_str("ANKUSA_METRICS_TOKEN", "")
# Per-connector health series (commands.health_metrics) for at most this many connectors, those
# failing the longest run first: a bound on the scrape's size whatever the number of connectors.
ANKUSA_METRICS_CONNECTORS = env_int("ANKUSA_METRICS_CONNECTORS", 100, minimum=0, maximum=10_000)

# --- logs ---------------------------------------------------------------------------------------

ANKUSA_LOG_FORMAT = env_choice("ANKUSA_LOG_FORMAT", "text", ("text", "json"))
ANKUSA_LOG_LEVEL = env_choice("ANKUSA_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"()": "ankusa_site.core.logs.TextFormatter"},
        "json": {"()": "ankusa_site.core.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": ANKUSA_LOG_FORMAT},
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "ankusa": {"handlers": ["console"], "level": ANKUSA_LOG_LEVEL, "propagate": False},
    },
}
