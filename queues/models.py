"""Queue items of the database backend (``queues.backends.database``).

One row per item, whatever its sub-queue (``state``). An item is deleted when it is done, so the
table holds only work in hand, and each query of the backend is served by a partial index on
exactly the rows it reads: claims never walk past busy or failed rows, recovery never reads the
main queue.

``position`` orders the main queue (then ``id``). An enqueue takes positions after the last one
in main; a requeue to the tail does the same, a requeue to the head takes them before the first.
On PostgreSQL tail positions come from one sequence (migration 0002), so order among concurrent
producers follows the order they drew them, not their commits; on SQLite writers take turns.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class QueueItem(models.Model):
    class State(models.TextChoices):
        MAIN = "main", "waiting"
        BUSY = "busy", "claimed"
        FAILED = "failed", "failed"

    queue = models.CharField(max_length=64)
    state = models.CharField(max_length=6, choices=State.choices, default=State.MAIN)
    position = models.BigIntegerField()
    payload = models.JSONField()
    enqueued_at = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    claims = models.PositiveIntegerField(
        default=0, help_text="Times claimed; the token of the current claim."
    )
    requeue_count = models.PositiveIntegerField(default=0)
    fail_count = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [
            # claim: WHERE queue = %s AND state = 'main' ORDER BY position, id LIMIT n FOR UPDATE
            # SKIP LOCKED; also the MIN(position) of a requeue to the head, the MAX(position) of a
            # tail on SQLite (PostgreSQL takes tails from a sequence), and peek/age of main.
            models.Index(
                fields=["queue", "position", "id"], condition=Q(state="main"), name="queueitem_main_order"
            ),
            # handle_expired: WHERE queue = %s AND state = 'busy' AND claimed_at < %s ORDER BY
            # claimed_at; also peek/age of busy.
            models.Index(
                fields=["queue", "claimed_at"], condition=Q(state="busy"), name="queueitem_busy_claimed"
            ),
            # remove_failed / requeue_failed: WHERE queue = %s AND state = 'failed' AND failed_at <= %s
            # ORDER BY failed_at; also peek/age of failed.
            models.Index(
                fields=["queue", "failed_at", "id"], condition=Q(state="failed"), name="queueitem_failed_at"
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["main", "busy", "failed"]), name="queueitem_state_valid"
            ),
            models.CheckConstraint(
                condition=~Q(state="busy") | Q(claimed_at__isnull=False), name="queueitem_busy_has_claim_time"
            ),
            models.CheckConstraint(
                condition=~Q(state="failed") | Q(failed_at__isnull=False),
                name="queueitem_failed_has_fail_time",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue} #{self.id} ({self.state})"
