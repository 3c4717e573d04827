"""``DispatcherHeartbeat``: one dispatch process's last round (``commands.dispatch.heartbeat``)."""

from __future__ import annotations

from django.db import models


class DispatcherHeartbeat(models.Model):
    """One dispatch process (a ``manage.py dispatch`` loop or a Celery worker process) and the last
    round it ran: written by ``commands.dispatch.heartbeat.beat``, read by the dashboard."""

    class Kind(models.TextChoices):
        LOOP = "loop", "dispatch loop"
        CELERY = "celery", "Celery worker"

    name = models.CharField(max_length=200, unique=True, help_text="host:pid of the process.")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    started_at = models.DateTimeField(help_text="Its first round.")
    last_round_at = models.DateTimeField(db_index=True)
    rounds = models.PositiveBigIntegerField(default=1)

    class Meta:
        ordering = ["-last_round_at"]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.name}"
