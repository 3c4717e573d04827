"""What ``/metrics`` reads of the commands at scrape time: commands by state, those held back by
skip reason, connectors that send nothing now (paused, held) and the health of the connectors
failing longest (``commands.health_metrics``). Registered by ``CommandsConfig.ready()`` with
``ankusa_site.core.metrics``.

Read from the table at each scrape (no gauge to keep in step); fleet-wide, so every node reports
the same figures. Not per tenant or connector (unbounded label values).
"""

from __future__ import annotations

from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily


class CommandsCollector:
    def collect(self):
        from commands.health_metrics import collect as connector_health  # per connector, bounded
        from commands.models import Command, Connector  # at scrape: the app registry is ready by then

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

        stopped = GaugeMetricFamily(
            "ankusa_connectors_stopped", "Connectors that send nothing now, by why.", labels=["why"]
        )
        stopped.add_metric(["paused"], Connector.objects.filter(paused_at__isnull=False).count())
        stopped.add_metric(["held"], Connector.objects.filter(held_since__isnull=False).count())
        yield stopped

        yield from connector_health()
