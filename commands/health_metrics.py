"""Connector health as Prometheus series, read from ``commands.health``'s summary at scrape time.

Labels: ``tenant`` (its slug) and ``connector`` (its name; unique within a tenant). Bounded: at
most ``ANKUSA_METRICS_CONNECTORS`` connectors (100 by default) are labelled one by one, those that
ever sent ranked by failures in a row, then latest failure: with fewer connectors than that, every
one that sent; with more, the worst (one that recovers may leave the set, and its series stop).
``ankusa_connectors_failing`` counts every connector whose last send failed, labelled or not. A few series per labelled connector, so a scrape stays the same size
with 10 or 10,000 connectors. Every node answers the same figures: aggregate them with ``max``.
"""

from __future__ import annotations

import math

from django.conf import settings
from prometheus_client.core import GaugeMetricFamily

from commands import health_figures
from commands.models.health import ConnectorHealth

WINDOWS = (("1h", "hour"), ("24h", "day"))


def collect():
    labels = ["tenant", "connector"]
    failing = GaugeMetricFamily(
        "ankusa_connectors_failing", "Connectors whose last recorded send failed (all of them)."
    )
    failing.add_metric([], ConnectorHealth.objects.filter(consecutive_failures__gt=0).count())
    yield failing
    sends = GaugeMetricFamily(
        "ankusa_connector_sends", "Recorded sends per window.", labels=[*labels, "window"]
    )
    rate = GaugeMetricFamily(
        "ankusa_connector_success_ratio",
        "Share of recorded sends that succeeded.",
        labels=[*labels, "window"],
    )
    seconds = GaugeMetricFamily(
        "ankusa_connector_send_seconds",
        "Send time quantile (upper bound of its histogram bin; +Inf past the last one).",
        labels=[*labels, "window", "quantile"],
    )
    run = GaugeMetricFamily(
        "ankusa_connector_consecutive_failures", "Recorded sends failed in a row.", labels=labels
    )
    last_error = GaugeMetricFamily(
        "ankusa_connector_last_error_timestamp_seconds", "When its last failed send finished.", labels=labels
    )
    waiting = GaugeMetricFamily(
        "ankusa_connector_commands_waiting",
        f"Its commands waiting, by why (each counted up to {health_figures.CAP + 1}).",
        labels=[*labels, "reason"],
    )
    limit = settings.ANKUSA_METRICS_CONNECTORS
    for connector, figures in health_figures.worst(limit, failing_only=False) if limit else []:
        names = [connector.tenant.slug, connector.name]
        for window, attribute in WINDOWS:
            shown: health_figures.Window = getattr(figures, attribute)
            sends.add_metric([*names, window], shown.sends)
            if shown.sends:
                rate.add_metric([*names, window], shown.ok / shown.sends)
                for q in (0.5, 0.95):
                    seconds.add_metric([*names, window, str(q)], shown.quantile(q) or math.inf)
        run.add_metric(names, figures.consecutive_failures)
        if figures.last_error_at:
            last_error.add_metric(names, figures.last_error_at.timestamp())
        for reason, n in figures.waiting.items():
            if n:
                waiting.add_metric([*names, reason], n)
    yield from (sends, rate, seconds, run, last_error, waiting)
