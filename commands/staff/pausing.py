"""Pause and resume a connector — staff's act, for the admin and the REST API alike (one call per
door, as ``commands.staff.actions``).

* :func:`pause` — with a reason: from its commit on, the sweep takes none of the connector's
  commands and the drain sets aside one claimed meanwhile (``commands.dispatch.hold``), so nothing is sent
  to it and no attempt is spent; its commands explain that they wait for the pause, since when.
* :func:`resume` — its waiting commands get due times at ``ANKUSA_RESEND_PER_S`` (a long pause
  does not end in a burst) and the dispatchers are woken.

Both need ``commands.pause_connector`` (the operator group and up), are compare-and-set updates
(of two people pausing one connector, one pauses and the other is told it is paused already) and
write one ``AuditEntry`` (``pause`` / ``resume``, the connector, who, why) and one log line. A pause
and an outage hold are apart: resuming does not end a hold, nor does a hold's release end a pause.
Not guaranteed: a send a dispatcher claimed before the pause committed still goes.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ankusa_site.core.logs import log_event
from commands.dispatch import hold
from commands.models import AuditEntry, Connector
from commands.staff.actions import MAX_REASON, Refused

logger = logging.getLogger("ankusa.commands.pausing")

PERMISSION = "commands.pause_connector"


def check_permission(user, verb: str) -> None:
    from django.core.exceptions import PermissionDenied

    if not getattr(user, "pk", None) or not user.has_perm(PERMISSION):
        raise PermissionDenied(f"You may not {verb} a connector.")


def clean_reason(reason) -> str:
    if not isinstance(reason, str):
        raise Refused("reason_invalid", "The reason must be text.")
    reason = reason.strip()
    if not reason:
        raise Refused("reason_required", "A pause needs a reason: say why nothing should be sent to it.")
    if len(reason) > MAX_REASON:
        raise Refused("reason_too_long", f"Keep the reason under {MAX_REASON} characters.")
    if "\x00" in reason:
        raise Refused("reason_invalid", "The reason holds a NUL character; type it again without one.")
    return reason


def pause(connector: Connector, *, user, via: str, reason, now: datetime | None = None) -> AuditEntry:
    """Pause ``connector`` (see the module docstring); its audit entry. ``Refused`` when it is
    paused already or the reason is missing; ``PermissionDenied`` without the permission."""
    check_permission(user, "pause")
    reason = clean_reason(reason)
    now = now or timezone.now()
    with transaction.atomic():
        paused = Connector.objects.filter(pk=connector.pk, paused_at__isnull=True).update(
            paused_at=now, paused_by=user, pause_reason=reason
        )
        if not paused:
            raise Refused("already_paused", f"Connector {connector} is paused already.")
        entry = _audit(AuditEntry.Action.PAUSE, connector, user=user, via=via, reason=reason, now=now)
    log_event(logger, "connector_paused", connector=connector.pk, by=entry.username, via=via, audit=entry.pk)
    return entry


def resume(connector: Connector, *, user, via: str, reason="", now: datetime | None = None) -> AuditEntry:
    """Resume a paused ``connector``; its audit entry. ``Refused`` when it is not paused."""
    check_permission(user, "resume")
    reason = "" if reason in (None, "") else clean_reason(reason)
    now = now or timezone.now()
    with transaction.atomic():
        resumed = Connector.objects.filter(pk=connector.pk, paused_at__isnull=False).update(
            paused_at=None, paused_by=None, pause_reason=""
        )
        if not resumed:
            raise Refused("not_paused", f"Connector {connector} is not paused.")
        # Still held (an outage): the hold's release paces them; else they go at the resend rate now.
        held = Connector.objects.filter(pk=connector.pk, held_since__isnull=False).exists()
        spread = 0 if held else hold.pace_waiting(connector.pk, now)
        entry = _audit(
            AuditEntry.Action.RESUME, connector, user=user, via=via, reason=reason, now=now, done=spread
        )
        transaction.on_commit(hold.wake)
    log_event(
        logger,
        "connector_resumed",
        connector=connector.pk,
        by=entry.username,
        via=via,
        waiting=spread,
        audit=entry.pk,
    )
    return entry


def _audit(action: str, connector: Connector, *, user, via: str, reason: str, now: datetime, done: int = 0):
    return AuditEntry.objects.create(
        at=now,
        user=user,
        username=user.get_username(),
        action=action,
        via=via,
        reason=reason,
        connector=connector,
        count=0,  # commands asked for and changed: none, the act is on the connector
        done=0,
        result={"connector": connector.pk, "name": str(connector), "waiting": done},
    )
