"""One dispatch round (:func:`run_round`: recover, then sweep and drain at once) and the timer that
recovers on its own in a long-running loop (:func:`keep_recovering`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import connections

from ankusa_site.core import metrics
from commands.dispatch import heartbeat
from commands.dispatch.dispatcher import Dispatcher, DrainSummary
from commands.dispatch.recorder import replay_spool
from commands.dispatch.recovery import RecoverSummary, recover, recovery_line
from commands.dispatch.sweep import SweepSummary, sweep
from commands.dispatch.timing import retry_delay

logger = logging.getLogger("ankusa.commands.dispatch")


def keep_recovering(
    dispatcher: Dispatcher,
    stop: threading.Event,
    *,
    every: float,
    report: Callable[[RecoverSummary], None] = lambda summary: None,
    wait: Callable[[float], bool] | None = None,
) -> None:
    """Run :func:`recover` every ``every`` seconds until ``stop``, for a long-running loop: a
    killed dispatcher's work is back within the visibility timeout plus ``every``, whatever the
    round interval. The outcomes ``dispatcher`` holds unwritten are not taken for lost. A failed
    recovery (the database is down) is tried again after a pause doubling up to ``RETRY_MAX_S``.
    ``report`` gets each summary that recovered something; ``wait`` (default ``stop.wait``) is
    the clock tests inject."""
    wait = wait or stop.wait
    failures = 0
    while not stop.is_set():
        try:
            replay_spool(dispatcher.queue)  # a spooled outcome is written back, not taken for lost
            summary = recover(
                queue=dispatcher.queue, pending=dispatcher.pending_commands(), until=stop.is_set
            )
        except Exception as exc:
            failures += 1
            if failures == 1:
                logger.exception("dispatch recovery failed; trying again")
            else:
                logger.warning("dispatch recovery failed again (%s)", exc)
            connections.close_all()
        else:
            failures = 0
            if summary.worker_lost or summary.items_requeued or summary.lost_requeued:
                report(summary)
        if wait(retry_delay(failures, every) if failures else every):
            break
    connections.close_all()


@dataclass
class RoundSummary:
    recovered: RecoverSummary | None  # None: recovery runs on its own timer (keep_recovering)
    swept: SweepSummary
    drained: DrainSummary
    seconds: float

    def line(self) -> str:
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.swept.skipped.items())) or "none"
        recovered = "" if self.recovered is None else f"{recovery_line(self.recovered)}; "
        return (
            f"dispatch round: took {self.swept.taken}, skipped {skipped}; "
            f"{self.drained.line()}; {recovered}{self.seconds:.2f} s"
        )


def run_round(
    dispatcher: Dispatcher,
    *,
    max_seconds: float | None = None,
    recovering: bool = True,
    clock: Callable[[], float] = time.monotonic,
) -> RoundSummary:
    """Recover (unless ``recovering`` is False: a timer does it), then sweep and drain at once:
    recovery first, so a restart resumes in one round; the sweep in a thread of its own, so the
    drain sends what each sweep batch has queued (and committed) while the sweep decides on the
    next, instead of waiting for the whole sweep. ``clock`` times the round (tests move it)."""
    started = clock()
    heartbeat.beat("loop")  # the dashboard's "is the loop alive"
    replay_spool(dispatcher.queue)  # before recovery, which would take the spooled sends for lost
    recovered = None
    if recovering:
        # Bounded by the round's own bound (and a stop), a batch at a time.
        deadline = None if max_seconds is None else started + max_seconds

        def until() -> bool:
            return dispatcher.stop.is_set() or (deadline is not None and clock() >= deadline)

        recovered = recover(queue=dispatcher.queue, pending=dispatcher.pending_commands(), until=until)
    swept: list[SweepSummary] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def sweeping() -> None:
        try:
            swept.append(sweep(queue=dispatcher.queue))
        except BaseException as exc:  # raised again in this thread, after the drain
            failed.append(exc)
        finally:
            connections.close_all()
            done.set()

    sweeper = threading.Thread(target=sweeping, name="sweep", daemon=True)
    sweeper.start()
    try:
        drained = dispatcher.drain(max_seconds=max_seconds, fed_until=done)
    finally:
        sweeper.join()
    if failed:
        raise failed[0]
    seconds = clock() - started
    metrics.DISPATCH_ROUND.observe(seconds)
    return RoundSummary(recovered, swept[0], drained, seconds)
