"""Prometheus metrics: what each process counts, and what ``/metrics`` reads at scrape time.

Two kinds of figures:

* **Counters and histograms** that the code bumps where things happen (intake answers, store
  calls, dispatch attempts, recovered queue items, loop rounds). They live in the process that
  counted them. With ``PROMETHEUS_MULTIPROC_DIR`` set (``manage.py serve`` and the deploy units
  set it, one folder per node, emptied at start), every gunicorn worker, dispatch loop and Celery
  worker writes to files there and ``/metrics`` sums them, so a scrape that lands on any worker
  sees the whole node. Without it (tests, a bare ``runserver``) they are plain in-process values.
* **State read at scrape time** from the database and the queues (commands by state and by skip
  reason, queue lengths and oldest ages): nobody has to keep a gauge in step with the tables, and
  every node reports the same fleet-wide truth — sum them with ``max`` in PromQL, not ``sum``.

Who may scrape: a request from loopback, or one that carries ``Authorization: Bearer
<ANKUSA_METRICS_TOKEN>``; one that presents an ``Authorization`` header is judged by it alone,
from loopback too. Behind a reverse proxy on the same host every request comes from loopback: the
proxy refuses a scrape of ``/metrics`` without that header (deploy/nginx/ankusa.conf).

What it does not do: keep counters across a node restart (Prometheus' ``rate()`` handles resets),
or label anything with a command id, or a tenant or connector beyond a fixed number of them
(``commands.health_metrics``: the ``ANKUSA_METRICS_CONNECTORS`` failing longest), since unbounded
label values would grow the scrape without end.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import logging
import os

from django.conf import settings
from django.http import HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from ankusa_site.core.answers import error
from ankusa_site.core.probes import probe

logger = logging.getLogger("ankusa.metrics")

# Bytes: 256 B to 8 MiB, the range of webhook bodies we see (the default cap is 1 MiB).
SIZE_BUCKETS = (256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 8388608)
# Seconds: a cached answer in 1 ms up to the 30 s read timeout of a slow receiver.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

# --- intake -----------------------------------------------------------------------------------
INTAKE_RESPONSES = Counter(
    "ankusa_intake_responses_total", "Intake answers by endpoint and HTTP status.", ["endpoint", "status"]
)
INTAKE_REQUEST_BYTES = Histogram(
    "ankusa_intake_request_bytes",
    "Declared request size (Content-Length).",
    ["endpoint"],
    buckets=SIZE_BUCKETS,
)
INTAKE_BODY_BYTES = Histogram(
    "ankusa_intake_body_bytes", "Bytes of body actually read.", ["endpoint"], buckets=SIZE_BUCKETS
)
INTAKE_LATENCY = Histogram(
    "ankusa_intake_latency_seconds",
    "Time to answer an intake request.",
    ["endpoint"],
    buckets=LATENCY_BUCKETS,
)

# --- limits -----------------------------------------------------------------------------------
STORE_CALLS = Counter("ankusa_store_calls_total", "Quota/claim store answers by result.", ["scope", "result"])
FLEET_FALLBACKS = Counter("ankusa_fleet_fallbacks_total", "Fleet store calls answered from local state.")
FLEET_BREAKER_OPEN = Gauge(
    "ankusa_fleet_breaker_open",
    "1 while this process's fleet circuit breaker is open.",
    multiprocess_mode="liveall",  # one series per live process: each has its own breaker
)

# --- queues -----------------------------------------------------------------------------------
QUEUE_RECOVERED = Counter(
    "ankusa_queue_recovered_total", "Expired busy items recovered, by queue and action.", ["queue", "action"]
)

# --- dispatch ---------------------------------------------------------------------------------
DISPATCH_ATTEMPTS = Counter(
    "ankusa_dispatch_attempts_total",
    "Send attempts by connector kind, outcome (ok/failed) and outlook.",
    ["kind", "outcome", "outlook"],
)
DISPATCH_LATENCY = Histogram(
    "ankusa_dispatch_latency_seconds", "Time of one send.", ["kind"], buckets=LATENCY_BUCKETS
)
DISPATCH_ROUND = Histogram(
    "ankusa_dispatch_round_seconds",
    "Duration of one dispatch loop round.",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
CONNECTOR_HOLDS = Counter(
    "ankusa_connector_holds_total",
    "Outage holds of connectors: held (tripped by failures) and released (by a successful send).",
    ["event"],
)


@functools.cache
def labelled(metric, *values: str):
    """``metric.labels(*values)`` (values in the order of its label names), kept: a label set's child
    is the same object for the process's life, and asking for it again costs more than the count
    itself on the hot paths (a lock and a validation of every value, each call)."""
    return metric.labels(*values)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


# An app's state read at scrape time, by name: each app registers its own collector (an object
# whose ``collect()`` yields metric families) in its ``AppConfig.ready()``, so this module, which
# every app imports, imports none of them.
_COLLECTORS: dict[str, object] = {}


def register_collector(name: str, collector) -> None:
    """Read ``collector`` at each scrape (registering a name again replaces its collector)."""
    _COLLECTORS[name] = collector


class _Scrape:
    """This node's counters (summed over its processes) plus the state read now."""

    def collect(self):
        if multiprocess_dir():
            counted = CollectorRegistry()
            MultiProcessCollector(counted)
            yield from counted.collect()
        else:
            yield from REGISTRY.collect()
        for name, collector in list(_COLLECTORS.items()):
            try:
                families = list(collector.collect())  # all of an app's figures, or none of them
            except Exception as exc:  # noqa: BLE001 - counters still answer when the database does not
                logger.warning("metrics: state collection failed (%s): %s", name, type(exc).__name__)
                continue
            yield from families


def _allowed(request) -> bool:
    token = settings.ANKUSA_METRICS_TOKEN
    given = request.headers.get("Authorization")
    if given is not None:
        # A scrape that presents credentials is judged by them alone: behind nginx on the same host
        # every request comes from loopback, and nginx passes on only those that present some.
        return bool(token) and hmac.compare_digest(given.encode(), f"Bearer {token}".encode())
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


@probe
def metrics_view(request):
    if not _allowed(request):
        return error(
            "forbidden",
            "Scrape /metrics from loopback or with 'Authorization: Bearer <ANKUSA_METRICS_TOKEN>'.",
            403,
        )
    return HttpResponse(generate_latest(_Scrape()), content_type=CONTENT_TYPE_LATEST)
