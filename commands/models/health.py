"""The connector health summary's two tables (written by ``commands.health``, never by hand).

* ``HealthBucket``: one connector's recorded sends in one minute (``span`` 60) or one hour (``span``
  3600): how many, how many succeeded, and how many took each range of ``SEND_TIME_BOUNDS`` (a
  fixed histogram, ``h0`` … ``h14``, from which p50/p95 are read). Rows only grow by addition, so
  two dispatch processes recording into one bucket at once both count.
* ``ConnectorHealth``: one row per connector that ever sent: its consecutive failures, its last
  error and when, its last success and its last send.
"""

from __future__ import annotations

from django.db import models

# Seconds: the upper bound of each histogram bin but the last, which holds everything slower.
# From a cached answer's 5 ms to the 300 s a patient receiver may take.
SEND_TIME_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
BINS = len(SEND_TIME_BOUNDS) + 1
BIN_FIELDS = tuple(f"h{i}" for i in range(BINS))
MINUTE, HOUR = 60, 3600


class HealthBucket(models.Model):
    connector = models.ForeignKey(
        "commands.Connector", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    span = models.PositiveIntegerField(help_text="Seconds the bucket covers: 60 or 3600.")
    start = models.DateTimeField()
    sends = models.PositiveIntegerField(default=0)
    ok = models.PositiveIntegerField(default=0)
    h0 = models.PositiveIntegerField(default=0)
    h1 = models.PositiveIntegerField(default=0)
    h2 = models.PositiveIntegerField(default=0)
    h3 = models.PositiveIntegerField(default=0)
    h4 = models.PositiveIntegerField(default=0)
    h5 = models.PositiveIntegerField(default=0)
    h6 = models.PositiveIntegerField(default=0)
    h7 = models.PositiveIntegerField(default=0)
    h8 = models.PositiveIntegerField(default=0)
    h9 = models.PositiveIntegerField(default=0)
    h10 = models.PositiveIntegerField(default=0)
    h11 = models.PositiveIntegerField(default=0)
    h12 = models.PositiveIntegerField(default=0)
    h13 = models.PositiveIntegerField(default=0)
    h14 = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            # The upsert's conflict target, and the page's read: a connector's buckets of a span
            # from a start on, one index range each.
            models.UniqueConstraint(fields=["connector", "span", "start"], name="commands_health_bucket_key"),
        ]
        indexes = [
            # Retention: old buckets of a span.
            models.Index(fields=["span", "start"], name="commands_health_bucket_age_idx"),
        ]


class ConnectorHealth(models.Model):
    connector = models.OneToOneField(
        "commands.Connector", on_delete=models.CASCADE, primary_key=True, related_name="health"
    )
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_error_class = models.CharField(max_length=100, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    last_ok_at = models.DateTimeField(null=True, blank=True)
    last_send_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "connector health"
        indexes = [
            # The dashboard's worst few and the metrics' bounded set: longest run of failures first.
            models.Index(
                fields=["-consecutive_failures", "-last_error_at"], name="commands_health_worst_idx"
            ),
        ]
