"""``manage.py queues stats|recover|requeue-failed|remove-failed|flush``: the queue, for operators.

Without ``--queue`` a command acts on every known queue of both backends (``queues.actions``);
``flush`` needs the queue named and asks for confirmation unless ``--yes``. Long runs work in
batches of 1,000 items and draw a progress bar when stdout is a terminal; in cron (no terminal)
they print one summary line per queue, and only when something was moved, so a quiet night
sends no mail. ``--verbosity 0`` silences the summaries too.

A number it cannot use (``--delay inf``, ``--older-than nan``, a negative one, a fail count past a
32-bit integer) is refused by the argument parser, naming the option, before any queue is touched:
the same bounds as the REST endpoints (``queues.api``).

Meant for cron: ``queues recover`` every minute is what recovers items whose consumer died, when
the dispatch loop is not running its own recovery.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

from ankusa_site.core.arguments import seconds
from queues.actions import known_queues, overview
from queues.api import MAX_FAIL_COUNT
from queues.backends import get_queue
from queues.fifo import ACTIONS, KINDS, NAME_PATTERN, ReliableFIFO

CHUNK = 1000


def fail_count(text: str) -> int:
    """An argument type: a whole number a fail count column can be compared with."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_FAIL_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 0 to {MAX_FAIL_COUNT:,}")
    return value


class Progress:
    """A one-line progress bar on a terminal; nothing at all elsewhere."""

    WIDTH = 30

    def __init__(self, stream, label: str, total: int):
        self.stream, self.label, self.total, self.done = stream, label, max(total, 1), 0
        self.active = stream.isatty() and total > CHUNK

    def advance(self, count: int) -> None:
        self.done += count
        if self.active:
            filled = min(self.WIDTH, self.WIDTH * self.done // self.total)
            bar = "#" * filled + "." * (self.WIDTH - filled)
            self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total}", ending="")
            self.stream.flush()

    def close(self) -> None:
        if self.active:
            self.stream.write("")


class Command(BaseCommand):
    help = "Inspect and repair the reliable queues: stats, recover, requeue-failed, remove-failed, flush."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        def with_queue(p, required=False):
            p.add_argument(
                "--queue",
                action="append",
                required=required,
                help="Queue name (repeatable)."
                + ("" if required else " Without it: every known queue of both backends."),
            )
            p.add_argument(
                "--backend", choices=["database", "redis"], help="Override the configured backend."
            )
            return p

        stats = with_queue(sub.add_parser("stats", help="Lengths and ages of every sub-queue."))
        stats.add_argument("--json", action="store_true", help="One JSON document instead of a table.")
        recover = with_queue(sub.add_parser("recover", help="Recover items claimed too long ago."))
        recover.add_argument("--older-than", type=seconds, help="Seconds (default: the visibility timeout).")
        recover.add_argument("--action", choices=ACTIONS, default="requeue", dest="on_expiry")
        requeue = with_queue(sub.add_parser("requeue-failed", help="Move failed items back to the queue."))
        requeue.add_argument(
            "--max-fail-count", type=fail_count, help="Only items that failed at most this often."
        )
        requeue.add_argument(
            "--delay", type=seconds, help="Only items that failed at least this many seconds ago."
        )
        remove = with_queue(sub.add_parser("remove-failed", help="Delete failed items."))
        remove.add_argument(
            "--older-than", type=seconds, help="Only items that failed at least this many seconds ago."
        )
        flush = with_queue(sub.add_parser("flush", help="Delete every item of a queue."), required=True)
        flush.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")

    def handle(self, *args, **options):
        self.verbosity = options["verbosity"]
        if options["action"] == "stats":
            return self.stats(options)
        for queue in self.queues(options):
            getattr(self, options["action"].replace("-", "_"))(queue, options)

    def queues(self, options) -> list[ReliableFIFO]:
        if not options["queue"]:
            queues, problems = known_queues()
            for problem in problems:
                self.stderr.write(problem)
            return queues
        for name in options["queue"]:
            if not NAME_PATTERN.match(name):
                raise CommandError(f"{name!r} is not a queue name.")
        return [get_queue(name, backend=options["backend"]) for name in options["queue"]]

    # --- the actions, one method each -------------------------------------------------------------

    def stats(self, options) -> None:
        if options["queue"]:
            data = {"queues": [queue.stats() for queue in self.queues(options)], "problems": []}
        else:
            data = overview()
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2))
            return
        self.stdout.write(f"{'queue':<24} {'backend':<9} {'main':>9} {'busy':>9} {'failed':>9}  oldest (s)")
        for row in data["queues"]:
            if "error" in row:
                self.stdout.write(f"{row['name']:<24} {row['backend']:<9} {row['error']}")
                continue
            ages = " / ".join(
                "-" if row[kind]["age_s"] is None else f"{row[kind]['age_s']:.0f}" for kind in KINDS
            )
            lengths = " ".join(f"{row[kind]['length']:>9}" for kind in KINDS)
            self.stdout.write(f"{row['name']:<24} {row['backend']:<9} {lengths}  {ages}")
        for problem in data["problems"]:
            self.stderr.write(problem)

    def recover(self, queue: ReliableFIFO, options) -> None:
        older_than = _seconds(options["older_than"])
        action = options["on_expiry"]
        count = self.in_chunks(
            queue,
            "recover",
            queue.length("busy"),
            lambda: len(queue.handle_expired(older_than, action, limit=CHUNK)),
        )
        self.summary(queue, count, f"expired item(s): {action}")

    def requeue_failed(self, queue: ReliableFIFO, options) -> None:
        delay = _seconds(options["delay"])
        count = self.in_chunks(
            queue,
            "requeue failed",
            queue.length("failed"),
            lambda: queue.requeue_failed(options["max_fail_count"], delay, limit=CHUNK),
        )
        self.summary(queue, count, "failed item(s) requeued")

    def remove_failed(self, queue: ReliableFIFO, options) -> None:
        older_than = _seconds(options["older_than"])
        count = self.in_chunks(
            queue,
            "remove failed",
            queue.length("failed"),
            lambda: queue.remove_failed(older_than, limit=CHUNK),
        )
        self.summary(queue, count, "failed item(s) removed")

    def in_chunks(self, queue: ReliableFIFO, label: str, total: int, step) -> int:
        """Call ``step`` (which handles up to CHUNK items, returning how many) until it runs dry."""
        progress = Progress(self.stdout, f"{queue.name}: {label}", total)
        while count := step():
            progress.advance(count)
            if count < CHUNK:
                break
        progress.close()
        return progress.done

    def flush(self, queue: ReliableFIFO, options) -> None:
        total = sum(queue.length(kind) for kind in KINDS)
        if not options["yes"]:
            if not self.stdin_isatty():
                raise CommandError("flush deletes items: confirm on a terminal or pass --yes.")
            answer = input(
                f"Delete all {total} item(s) of {queue.backend} queue {queue.name!r}? Type 'yes': "
            )
            if answer.strip() != "yes":
                raise CommandError("Not flushed.")
        self.summary(queue, queue.flush(), "item(s) flushed", always=True)

    # --- output -----------------------------------------------------------------------------------

    def summary(self, queue: ReliableFIFO, count: int, text: str, *, always: bool = False) -> None:
        if self.verbosity >= 1 and (count or always or self.stdout.isatty()):
            self.stdout.write(f"{queue.backend} queue {queue.name}: {count} {text}")

    def stdin_isatty(self) -> bool:
        return sys.stdin.isatty()


def _seconds(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)
