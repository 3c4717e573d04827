"""``Attempt``: one dispatch of one command, written once and complete."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from commands.models.command import Command
from commands.retry import Outlook


class Attempt(models.Model):
    command = models.ForeignKey(Command, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(null=True, help_text="Empty while in flight, or when the outcome is unknown.")
    outlook = models.CharField(max_length=16, choices=Outlook.choices, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error_class = models.CharField(max_length=100, blank=True)
    error_message = models.TextField(blank=True)
    response_excerpt = models.TextField(blank=True)
    manual = models.BooleanField(default=False, help_text="Started by a person (a resend), not the loop.")
    manual_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["command", "number"]
        constraints = [
            models.UniqueConstraint(fields=["command", "number"], name="commands_attempt_unique_number"),
        ]
        indexes = [
            # The dashboard's chart: attempts finished in the last 24 hours, by hour.
            models.Index(fields=["finished_at"], name="commands_attempt_finished_idx"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of command {self.command_id}"
