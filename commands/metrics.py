"""What ``/metrics`` reads of the commands at scrape time: commands by state, and those held back
by skip reason. Registered by ``CommandsConfig.ready()`` with ``ankusa_site.core.metrics``.

Read from the table at each scrape (no gauge to keep in step); fleet-wide, so every node reports
the same figures. Not per tenant or connector (unbounded label values).
"""

from __future__ import annotations

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily


class CommandsCollector:
    def collect(self):
        from commands.models import Command  # at scrape: the app registry is ready by then

        by_state = GaugeMetricFamily("ankusa_commands", "Commands by state.", labels=["state"])
        for row in Command.objects.order_by().values("state").annotate(n=Count("id")):
            by_state.add_metric([row["state"]], row["n"])
        yield by_state

        waiting = GaugeMetricFamily(
            "ankusa_commands_waiting", "Commands held back, by skip reason.", labels=["state", "reason"]
        )
        held = Command.objects.order_by().exclude(skip_reason="").values("state", "skip_reason")
        for row in held.annotate(n=Count("id")):
            waiting.add_metric([row["state"], row["skip_reason"]], row["n"])
        yield waiting
