"""The dispatch loop's pauses and pool sizes: how long a wait lasts, how much a dispatcher holds and
claims, and :func:`retry_delay`, the doubling pause after failed tries (capped at ``RETRY_MAX_S``).
"""

from __future__ import annotations

# How long the consume loop waits for a send to finish before it looks at the stop flag again.
POLL_S = 0.2


# Claimed sends a dispatcher holds, and claims at a time, in pools (ANKUSA_DISPATCH_CONCURRENCY).
HELD_POOLS = 4


CLAIM_POOLS = 2


# How often a drain fed by the round's sweep looks for items again when it finds none: a sweep
# batch takes about as long to decide and commit.
FEED_POLL_S = 0.01


# After a failed write of outcomes (the database is down), the recorder tries again after this
# pause, doubling up to RETRY_MAX_S: a database back from a restart is written to within it, and
# an outage costs a log line per try rather than a spin. The loop's own retries share the cap.
RECORD_RETRY_FIRST_S = 0.05


RETRY_MAX_S = 2.0


# How long a drain with a deadline (a Celery task) waits past it for its outcomes to be written
# before it ends anyway; its dispatcher keeps trying them, and spools them when it closes.
RECORD_PATIENCE_S = 10.0


def retry_delay(failures: int, first: float, cap: float = RETRY_MAX_S) -> float:
    """The pause before the next try after ``failures`` failed tries in a row: ``first`` doubling,
    at most ``cap`` (or ``first``, if that is longer)."""
    return min(first * 2 ** max(failures - 1, 0), max(cap, first))
