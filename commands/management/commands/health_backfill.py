"""``manage.py health_backfill``: build the connector health summary from the last day's attempts
(``commands.health.backfill``) — once after upgrading an install that already has attempts, with
the dispatch loop stopped."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from commands import health


class Command(BaseCommand):
    help = "Build the connector health summary again from the attempts of the last day."

    def handle(self, *args, **options):
        counted = health.backfill()
        self.stdout.write(f"connector health: {counted} sends of the last day summarised")
