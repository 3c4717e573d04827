"""``manage.py prune [--older-than 30d]``: delete old finished rows and old health buckets in batches
(``commands.retention``)."""

from __future__ import annotations

import re
import sys
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from ankusa_site.core.arguments import seconds
from commands import retention

UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def parse_age(value: str) -> timedelta:
    match = re.fullmatch(r"(\d{1,5})([dhm])", value.strip())
    if not match:
        raise CommandError(f"--older-than {value!r}: use a whole number and d, h or m (30d, 12h, 90m).")
    age = timedelta(**{UNITS[match[2]]: int(match[1])})
    if age <= timedelta(0):
        raise CommandError("--older-than must be more than zero.")
    return age


class Command(BaseCommand):
    help = (
        "Delete finished commands, deliveries and audit rows older than their retention, and connector "
        "health buckets no figure reads, in batches."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than", help="one cutoff for every table (30d, 12h, 90m); default per table"
        )
        parser.add_argument("--batch", type=int, default=retention.DEFAULT_BATCH, help="rows per transaction")
        parser.add_argument(
            "--pause",
            type=seconds,
            default=None,
            help=f"seconds between batches (default {retention.DEFAULT_PAUSE_S:g}; "
            f"{retention.SQLITE_PAUSE_S:g} on SQLite)",
        )
        parser.add_argument("--only", action="append", choices=[t.name for t in retention.tables()])
        parser.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")

    def handle(self, *args, **options):
        if not 1 <= options["batch"] <= 50_000:
            raise CommandError("--batch must be between 1 and 50000.")
        older_than = parse_age(options["older_than"]) if options["older_than"] else None
        report = retention.prune(
            older_than=older_than,
            batch=options["batch"],
            pause_s=options["pause"],
            only=options["only"],
            dry_run=options["dry_run"],
            progress=self.progress if sys.stdout.isatty() and options["verbosity"] > 0 else None,
        )
        if sys.stdout.isatty():
            self.stdout.write("")
        prefix = "would have " if options["dry_run"] else ""
        self.stdout.write(prefix + report.line())

    def progress(self, table: str, count: int) -> None:
        self.stdout.write(f"\r{table}: -{count}", ending="")
        self.stdout.flush()
