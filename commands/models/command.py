"""``Command``: one instruction for one connector, whose ``state`` moves only along
``commands.states`` (:meth:`CommandQuerySet.transition`); ``FailedCommand``, the failed list's proxy.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from commands.models.connector import Connector
from commands.models.delivery import Delivery
from commands.models.source import Source
from commands.retry import Outlook, SkipReason
from commands.staff.explain import URGENCY_SQL
from commands.states import State, next_state
from limits.models import Tenant

# Skip reasons that only a person's act can change (a resend, a fix, a new command). The sweep does
# not look at commands parked with one of them again, which keeps its query independent of the
# size of the failed list.
PARKED_REASONS = (
    SkipReason.NOT_DISPATCHABLE,
    SkipReason.NEVER,
    SkipReason.ATTEMPTS_SPENT,
    SkipReason.OUTLOOK_UNKNOWN,
    SkipReason.NOT_IDEMPOTENT,
)


class CommandQuerySet(models.QuerySet):
    def due(self, now: datetime):
        """Commands the sweep decides on: approved or failed, not parked, due by ``now``."""
        return self.filter(
            Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now),
            state__in=[State.APPROVED, State.FAILED],
        ).exclude(skip_reason__in=PARKED_REASONS)

    def waiting_for_fix(self, connector: Connector):
        """``connector``'s failed commands whose adapter said a configuration fix is needed."""
        return self.filter(connector=connector, state=State.FAILED, last_outlook=Outlook.AFTER_FIX)

    def make_due(self, now: datetime) -> int:
        """Due at once: the next sweep decides again (clears the reason it was waiting for)."""
        return self.update(next_attempt_at=now, skip_reason="", skip_decided_at=None)

    def transition(self, state: str, event: str, now: datetime, **changes) -> int:
        """Move the commands of this queryset that are still in ``state`` by ``event``.

        One conditional UPDATE; returns how many moved, which the caller checks (``== 1`` for one
        command: 0 means another worker moved it first). ``changes`` are written with the move.
        """
        target = next_state(state, event)
        if target is None:
            raise ValueError(f"no transition from '{state}' on '{event}'")
        return self.filter(state=state).update(state=target, state_changed_at=now, **changes)


class Command(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="commands")
    connector = models.ForeignKey(Connector, on_delete=models.PROTECT, related_name="commands")
    source = models.ForeignKey(
        Source, on_delete=models.PROTECT, null=True, blank=True, related_name="commands"
    )
    idempotency_key = models.CharField(max_length=255, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.APPROVED)
    state_changed_at = models.DateTimeField(default=timezone.now)
    last_outlook = models.CharField(max_length=16, choices=Outlook.choices, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    skip_reason = models.CharField(max_length=32, choices=SkipReason.choices, blank=True)
    skip_decided_at = models.DateTimeField(null=True, blank=True)
    last_error_class = models.CharField(max_length=100, blank=True)
    last_error = models.TextField(blank=True)
    # The three person-made links below are empty on nearly every row: partial indexes (Meta) keep
    # them out of the index work of every insert.
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    approved_at = models.DateTimeField(null=True, blank=True)
    resent_from = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="resent_as",
        db_index=False,
        help_text="The command this one was made from (make-a-new-command).",
    )
    resend_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
        help_text="Set while a person's resend waits for its send: the sweep takes it at its due time "
        "whatever the retry decision says, once; the send's outcome clears it.",
    )
    delivery = models.ForeignKey(
        Delivery, on_delete=models.PROTECT, null=True, blank=True, related_name="commands"
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = CommandQuerySet.as_manager()

    class Meta:
        permissions = [
            ("approve_command", "Can approve a draft command"),
            ("resend_command", "Can resend a failed command"),
            ("resend_override_command", "Can resend a non-idempotent or unknown-outcome command"),
            ("cancel_command", "Can cancel a command"),
        ]
        constraints = [
            # A REST client's Idempotency-Key: one command per key and tenant, whatever the claim
            # store said. Only for API submissions (no source): a webhook's fan-out gives several
            # commands the same key (its event key), one per connector, and the delivery's own
            # constraint guards those. Also serves the lookup of the original after a refused insert.
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(source__isnull=True) & ~Q(idempotency_key=""),
                name="commands_command_unique_api_key",
            ),
        ]
        indexes = [
            # The sweep: CommandQuerySet.due(now) — approved/failed and not parked, by due time.
            models.Index(
                fields=["next_attempt_at"],
                name="commands_due_idx",
                condition=Q(state__in=[State.APPROVED, State.FAILED]) & ~Q(skip_reason__in=PARKED_REASONS),
            ),
            # The failed list, filtered by skip reason, newest first.
            models.Index(
                fields=["skip_reason", "-id"], name="commands_failed_idx", condition=Q(state=State.FAILED)
            ),
            # The failed list's default order: what needs a person first, then oldest first
            # (commands.staff.explain.urgency() — the same SQL text, which SQLite needs to use it).
            models.Index(
                RawSQL(URGENCY_SQL, []),
                F("id"),
                name="commands_failed_urgency_idx",
                condition=Q(state=State.FAILED),
            ),
            # The recovery: commands stuck in queued/dispatching, oldest state change first.
            models.Index(
                fields=["state_changed_at"],
                name="commands_in_flight_idx",
                condition=Q(state__in=[State.QUEUED, State.DISPATCHING]),
            ),
            # The person-made links, for a user's deletion and a copy's original: a handful of rows.
            models.Index(
                fields=["resend_by"], name="commands_resend_idx", condition=Q(resend_by__isnull=False)
            ),
            models.Index(
                fields=["approved_by"],
                name="commands_approved_by_idx",
                condition=Q(approved_by__isnull=False),
            ),
            models.Index(
                fields=["resent_from"],
                name="commands_resent_from_idx",
                condition=Q(resent_from__isnull=False),
            ),
            # A connector's after-fix commands, made due when the connector is saved.
            models.Index(
                fields=["connector", "last_outlook"],
                name="commands_connector_fix_idx",
                condition=Q(state=State.FAILED),
            ),
            # The connector list: each connector's failed commands (a capped count) and its latest
            # failure (last error and when), read newest first.
            models.Index(
                fields=["connector", "-state_changed_at"],
                name="commands_connector_failed_idx",
                condition=Q(state=State.FAILED),
            ),
            # The connector list: each connector's commands not sent yet (a capped count).
            models.Index(
                fields=["connector"],
                name="commands_connector_waiting_idx",
                condition=Q(state__in=[State.APPROVED, State.QUEUED]),
            ),
            # Connector health: each connector's failed commands by why they wait (capped counts,
            # commands.health_figures.waiting_annotations), one index range per reason, read from the index
            # alone (the resend link is in it: it decides between two reasons).
            models.Index(
                fields=["connector", "skip_reason", "last_outlook", "resend_by"],
                name="commands_connector_reason_idx",
                condition=Q(state=State.FAILED),
            ),
        ]

    def __str__(self) -> str:
        return f"command {self.pk} ({self.state})"

    def clean(self) -> None:
        if self.connector_id and self.tenant_id and self.connector.tenant_id != self.tenant_id:
            raise ValidationError({"connector": "The connector belongs to another tenant."})
        if self.source_id and self.tenant_id and self.source.tenant_id != self.tenant_id:
            raise ValidationError({"source": "The source belongs to another tenant."})


class FailedCommand(Command):
    """The failed-command list of the admin: the same rows, a list of their own."""

    class Meta:
        proxy = True
        verbose_name = "failed command"
