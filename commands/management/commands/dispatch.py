"""``manage.py dispatch``: the dispatch loop (recover, sweep, drain) every interval, or once.

Every ``ANKUSA_DISPATCH_INTERVAL_S`` (30 s — the first retry backoff, so a retry never waits an
extra round) it runs one round and prints a one-line summary. Between rounds it looks at the queue
every ``ANKUSA_DISPATCH_POLL_S`` (1 s) and drains what waits there — the commands intake accepted
and queued itself — printing a line for each drain that claimed something. ``--once`` runs one
round and exits (for cron); ``--max-seconds`` bounds the whole run. SIGTERM or SIGINT stops it: no
new item is claimed, the sends in flight finish and are recorded, the items held but not started go
back to the head of the queue, and it exits 0. A second identical signal kills it at once. A round that
fails (the database is down) is logged and the loop carries on; with ``--once`` it exits non-zero.

Any number of these may run at once (see ``commands.dispatch`` for why nothing is sent twice).
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from ankusa_site.management.arguments import seconds
from commands.dispatch import Dispatcher, drain_waiting, run_round

logger = logging.getLogger("ankusa.commands.dispatch")


class Command(BaseCommand):
    help = "Run the dispatch loop: recover, sweep and drain every interval (or --once)."

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="Run one round and exit.")
        parser.add_argument("--max-seconds", type=seconds, default=None, help="Stop after this many seconds.")
        parser.add_argument(
            "--interval",
            type=seconds,
            default=None,
            help=f"Seconds between rounds (default ANKUSA_DISPATCH_INTERVAL_S, {settings.ANKUSA_DISPATCH_INTERVAL_S:g}).",
        )

    def handle(self, *args, **options):
        stop = threading.Event()
        previous = self.install_stop_handlers(stop)
        try:
            self.run(stop, **options)
        finally:  # a caller in the same process (call_command) gets its own handlers back
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def run(self, stop: threading.Event, *, once=False, max_seconds=None, interval=None, **options):
        interval = interval or settings.ANKUSA_DISPATCH_INTERVAL_S
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        with Dispatcher(stop=stop) as dispatcher:
            while not stop.is_set():
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                # As Django does around each request: drop a connection that broke or aged out.
                close_old_connections()
                try:
                    self.stdout.write(run_round(dispatcher, max_seconds=left).line())
                except Exception:
                    if once:
                        raise
                    # A database or queue outage: the loop lives on and the next round retries;
                    # whatever this round left half-done is what recover() is for.
                    logger.exception("dispatch round failed; retrying in %g s", interval)
                if once or (deadline is not None and time.monotonic() >= deadline):
                    break
                next_round = time.monotonic() + interval
                if deadline is not None:
                    next_round = min(next_round, deadline)
                self.poll_until(dispatcher, next_round, stop)
        self.stdout.write("dispatch stopped")

    def poll_until(self, dispatcher: Dispatcher, next_round: float, stop: threading.Event) -> None:
        """Until ``next_round`` (or a stop): every poll period, drain what waits on the queue."""
        poll = settings.ANKUSA_DISPATCH_POLL_S
        while not stop.wait(max(0.0, min(poll, next_round - time.monotonic()))):
            left = next_round - time.monotonic()
            if left <= 0:
                return
            close_old_connections()
            try:
                drained = drain_waiting(dispatcher, max_seconds=left)
            except Exception:  # an outage: logged once, and the next round tries again
                logger.exception("dispatch drain failed; looking again at the next round")
                stop.wait(max(0.0, next_round - time.monotonic()))
                return
            if drained is not None and drained.drained.claimed:
                self.stdout.write(drained.line())

    def install_stop_handlers(self, stop: threading.Event) -> dict:
        """Set ``stop`` on SIGTERM or SIGINT; the handlers they had before, by signal."""

        def handler(signum, frame):
            stop.set()
            signal.signal(signum, signal.SIG_DFL)  # the same signal again ends it at once

        return {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}
