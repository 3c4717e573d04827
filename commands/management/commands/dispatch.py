"""``manage.py dispatch``: the dispatch loop (sweep, drain, recover) every interval, or once.

Every ``ANKUSA_DISPATCH_INTERVAL_S`` (30 s — the first retry backoff, so a retry never waits an
extra round) it runs one round and prints a one-line summary. Between rounds it looks at the queue
every ``ANKUSA_DISPATCH_POLL_S`` (1 s) and drains what waits there — the commands intake accepted
and queued itself — printing a line for each drain that claimed something. Between two looks it
waits to be woken (``queues.wake``): a commit that queues work (PostgreSQL's NOTIFY, the Redis
queue's wake list) starts the drain at once, and the poll only catches a lost wake; a wake with
nothing queued (a resend or an approval made commands due) brings the next round forward, once a
poll period at most. On SQLite nothing wakes it: it polls. Recovery (expired items,
lost sends) runs on a timer of its own, every ``ANKUSA_DISPATCH_RECOVER_S``, and prints a line when
it recovered something. ``--once`` runs one round, recovery included, and exits (for cron);
``--max-seconds`` bounds the whole run. SIGTERM or SIGINT stops it: no new item is claimed, the
sends in flight finish and are recorded (spooled to ``var/`` if the database is down, and written
back at the next start), the items held but not started go back to the head of the queue, and it
exits 0. A second identical signal kills it at once. A round or drain that fails (the database is
down) is logged and tried again after a poll period, doubling up to 2 s; with ``--once`` it exits
non-zero.

Any number of these may run at once (see ``commands.dispatch`` for why nothing is sent twice).
Run as a process of its own, the loop freezes what start-up loaded before its first round
(``ankusa_site.core.longlived``); run by ``call_command``, it leaves its caller's objects alone.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from ankusa_site.core.arguments import seconds
from ankusa_site.core.longlived import freeze_startup
from commands.dispatch.dispatcher import Dispatcher, PollSummary, drain_waiting
from commands.dispatch.recovery import RecoverSummary, recovery_line
from commands.dispatch.rounds import keep_recovering, run_round
from commands.dispatch.timing import retry_delay
from queues.wake import close_listeners, wait_until

logger = logging.getLogger("ankusa.commands.dispatch")
# The shortest time between two rounds brought forward by wakes with nothing queued.
EARLY_ROUND_GAP_S = 0.2


class Command(BaseCommand):
    help = "Run the dispatch loop: sweep and drain every interval, recover on a timer (or --once)."
    # The loop's clock; with ``pause``, what tests replace to move time instead of waiting it out.
    clock = staticmethod(time.monotonic)
    own_process = False  # run from the command line (manage.py dispatch), not by call_command

    def run_from_argv(self, argv):
        self.own_process = True
        super().run_from_argv(argv)

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
        deadline = None if max_seconds is None else self.clock() + max_seconds
        with Dispatcher(stop=stop) as dispatcher:
            if once:
                close_old_connections()
                self.stdout.write(run_round(dispatcher, max_seconds=max_seconds).line())
            else:
                if self.own_process:
                    freeze_startup()
                try:
                    self.loop(dispatcher, stop, interval, deadline)
                finally:
                    close_listeners()  # its wake connection, for a caller in the same process
        self.stdout.write("dispatch stopped")

    def loop(self, dispatcher: Dispatcher, stop: threading.Event, interval: float, deadline) -> None:
        """Rounds every ``interval``, drains every poll period between them, and recovery on a timer
        of its own, until ``stop`` or ``deadline``. A failed round or drain (the database or the
        queue is down) is tried again after a poll period, doubling up to ``RETRY_MAX_S``: the loop
        is back at work within seconds of the outage's end, not at the next round."""
        poll = min(settings.ANKUSA_DISPATCH_POLL_S, interval)
        self.queue = dispatcher.queue  # what pause() waits on
        ended = threading.Event()  # the recovery timer's stop: set by a signal or the deadline
        recovery = threading.Thread(
            target=keep_recovering,
            args=(dispatcher, ended),
            kwargs={
                "every": min(settings.ANKUSA_DISPATCH_RECOVER_S, interval),
                "report": self.report_recovery,
            },
            name="recover",
            daemon=True,
        )
        recovery.start()
        failures = 0
        next_round = self.clock()
        woken = False  # the last pause ended with a wake
        last_round = None  # when the last round started
        try:
            while not stop.is_set():
                now = self.clock()
                if deadline is not None and now >= deadline:
                    break
                until = next_round if deadline is None else min(next_round, deadline)
                # As Django does around each request: drop a connection that broke or aged out.
                close_old_connections()
                step = "round" if now >= next_round else "drain"
                try:
                    if step == "round":
                        left = None if deadline is None else max(0.0, deadline - now)
                        last_round = now
                        self.stdout.write(run_round(dispatcher, max_seconds=left, recovering=False).line())
                        next_round = self.clock() + interval
                    else:
                        left = max(0.0, until - now)
                        # Woken: work was just queued, so no look at the queue's head first.
                        drained = (
                            drain_now(dispatcher, left)
                            if woken
                            else drain_waiting(dispatcher, max_seconds=left)
                        )
                        if drained is not None and drained.drained.claimed:
                            self.stdout.write(drained.line())
                        if woken and (drained is None or not drained.drained.claimed):
                            # Woken with nothing queued: commands became due (a resend, an
                            # approval), so the next round (its sweep) comes forward: now, or
                            # EARLY_ROUND_GAP_S after the last one (wakes for items another
                            # dispatcher took first cost a sweep that often at most).
                            gap = min(poll, EARLY_ROUND_GAP_S)
                            soonest = now if last_round is None else max(now, last_round + gap)
                            next_round = min(next_round, soonest)
                    failures = 0
                    pause = min(poll, next_round - self.clock())  # a round due starts at once
                except Exception as exc:
                    # An outage: whatever this step left half-done is what recovery is for. A failed
                    # round stays due, and is tried again first.
                    failures += 1
                    pause = retry_delay(failures, poll)
                    if failures == 1:
                        logger.exception("dispatch %s failed; retrying in %g s", step, pause)
                    else:
                        logger.warning("dispatch %s failed again (%s); retrying in %g s", step, exc, pause)
                if deadline is not None:
                    pause = min(pause, deadline - self.clock())
                woken = bool(self.pause(stop, max(0.0, pause)))
        finally:
            ended.set()
            recovery.join()

    def pause(self, stop: threading.Event, seconds: float) -> bool:
        """Wait ``seconds``, or less: until the queue is woken (True: work was queued, or commands
        made due) or ``stop``."""
        queue = getattr(self, "queue", None)
        if queue is None:
            stop.wait(seconds)
            return False
        return wait_until(queue.wait_for_work, stop, seconds)

    def report_recovery(self, summary: RecoverSummary) -> None:
        self.stdout.write(f"dispatch recovery: {recovery_line(summary)}")

    def install_stop_handlers(self, stop: threading.Event) -> dict:
        """Set ``stop`` on SIGTERM or SIGINT; the handlers they had before, by signal."""

        def handler(signum, frame):
            stop.set()
            signal.signal(signum, signal.SIG_DFL)  # the same signal again ends it at once

        return {signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)}


def drain_now(dispatcher: Dispatcher, max_seconds: float) -> PollSummary:
    """A drain without the look at the queue's head that :func:`drain_waiting` makes first."""
    started = time.monotonic()
    drained = dispatcher.drain(max_seconds=max_seconds)
    return PollSummary(drained, time.monotonic() - started)
