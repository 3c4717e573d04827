"""``AuditEntry``: one staff action, as ``commands.staff.actions`` wrote it; never edited."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from commands.models.command import Command
from commands.models.connector import Connector


class AuditEntry(models.Model):
    """One staff action (admin or API): who, when, what, why, on which commands, and how it went."""

    class Action(models.TextChoices):
        APPROVE = "approve", "approve"
        RESEND = "resend", "resend"
        RESEND_OVERRIDE = "resend-override", "resend with override"
        CANCEL = "cancel", "cancel"
        NEW_COMMAND = "new-command", "make a new command"
        PAUSE = "pause", "pause a connector"
        RESUME = "resume", "resume a connector"

    at = models.DateTimeField(default=timezone.now, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    username = models.CharField(max_length=150, help_text="Kept when the user is deleted.")
    action = models.CharField(max_length=20, choices=Action.choices)
    via = models.CharField(max_length=8, choices=[("admin", "admin"), ("api", "API")])
    reason = models.TextField(blank=True)
    count = models.PositiveIntegerField(help_text="Commands the action was asked for.")
    done = models.PositiveIntegerField(help_text="Commands it changed.")
    result = models.JSONField(default=dict, blank=True, help_text="What happened to the others, by reason.")
    commands = models.ManyToManyField(Command, related_name="audit_entries", blank=True)
    connector = models.ForeignKey(
        Connector,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="audit_entries",
        help_text="The connector a pause or resume was about.",
    )

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.action} by {self.username} at {self.at:%Y-%m-%d %H:%M:%S}"
