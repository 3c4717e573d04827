"""What ``/metrics`` reads of the queues at scrape time: each sub-queue's length and oldest age,
and whether its backend answered. Registered by ``QueuesConfig.ready()`` with
``ankusa_site.core.metrics``.

A queue whose backend does not answer is reported ``ankusa_queue_up 0`` without figures; the others
still are.
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from queues.fifo import KINDS


class QueuesCollector:
    def collect(self):
        from queues.actions import overview  # at scrape: the app registry is ready by then

        length = GaugeMetricFamily(
            "ankusa_queue_length", "Items per sub-queue.", labels=["queue", "backend", "kind"]
        )
        age = GaugeMetricFamily(
            "ankusa_queue_oldest_age_seconds",
            "Age of the oldest item per sub-queue.",
            labels=["queue", "backend", "kind"],
        )
        up = GaugeMetricFamily(
            "ankusa_queue_up", "1 when the queue's backend answered the scrape.", labels=["queue", "backend"]
        )
        for row in overview()["queues"]:
            answered = "error" not in row
            up.add_metric([row["name"], row["backend"]], 1 if answered else 0)
            if not answered:
                continue
            for kind in KINDS:
                labels = [row["name"], row["backend"], kind]
                length.add_metric(labels, row[kind]["length"])
                age.add_metric(labels, row[kind]["age_s"] or 0)
        yield from (length, age, up)
