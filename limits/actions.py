"""What staff (admin, API) do to limits: set or remove an override, and reset a tenant's buckets.

Each change resets the tenant's buckets in the store once the transaction commits, so a raised
limit is not held back by debt accrued under the old one, and a rolled-back change resets nothing.
A reset is best effort: with the fleet store down it is logged and the tenant's debt drains by
itself within one old window.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from ankusa_site.core.logs import log_event
from limits.models import Kind, LimitOverride, Tenant
from limits.store import Error, get_store

logger = logging.getLogger("ankusa.limits")


def record_history(user, tenant: Tenant, flag: int, message: str, *, via: str) -> None:
    """A line in the tenant's admin history (what the admin writes for its own edits), so a change
    made through the API or the shell shows there too. Without a staff user there is no line."""
    if not isinstance(user, get_user_model()) or user.pk is None:
        return
    LogEntry.objects.log_actions(
        user.pk, [tenant], flag, change_message=f"{message} (via {via})", single_object=True
    )


def reset_buckets(tenant: Tenant) -> bool:
    """Forget ``tenant``'s buckets now; False (and a log line) when the store did not answer."""
    answer = get_store().reset(tenant.slug)
    if isinstance(answer, Error):
        log_event(
            logger, "bucket_reset_failed", level=logging.WARNING, tenant=tenant.slug, reason=answer.reason
        )
        return False
    return True


def reset_buckets_on_commit(tenant: Tenant) -> None:
    transaction.on_commit(lambda: reset_buckets(tenant))


@transaction.atomic
def set_override(
    tenant: Tenant,
    kind: str,
    *,
    rate: float,
    burst: int,
    reason: str = "",
    expires_at: datetime | None = None,
    by=None,
    via: str = "the API",
    now: datetime | None = None,
) -> tuple[LimitOverride, bool]:
    """Create or replace ``tenant``'s override of ``kind``; returns it and whether it is new.

    Raises ``ValidationError`` naming the field (``rate``, ``burst``, ``expires_at``, ...).
    """
    now = now or timezone.now()
    if expires_at is not None and expires_at <= now:
        raise ValidationError({"expires_at": "Must be in the future."})
    # Lock the tenant: two concurrent PUTs of one override update it one after the other.
    list(Tenant.objects.select_for_update().filter(pk=tenant.pk).values_list("pk", flat=True))
    override = LimitOverride.objects.filter(tenant=tenant, kind=kind).first()
    created = override is None
    if created:
        override = LimitOverride(tenant=tenant, kind=Kind(kind).value)
    override.rate, override.burst, override.reason = rate, burst, reason
    override.expires_at, override.set_by = expires_at, by
    override.full_clean(validate_constraints=False)
    override.save()
    until = f" until {override.expires_at:%Y-%m-%d %H:%M} UTC" if override.expires_at else ""
    record_history(
        by,
        tenant,
        CHANGE,
        f"{'Added' if created else 'Changed'} the {kind} override: {override.rate:g}/s, "
        f"burst {override.burst}{until} — {override.reason}",
        via=via,
    )
    reset_buckets_on_commit(tenant)
    return override, created


@transaction.atomic
def remove_override(tenant: Tenant, kind: str, *, by=None, via: str = "the API") -> bool:
    """Delete ``tenant``'s override of ``kind``; False when there was none."""
    deleted, _ = LimitOverride.objects.filter(tenant=tenant, kind=kind).delete()
    if deleted:
        record_history(by, tenant, CHANGE, f"Removed the {kind} override.", via=via)
        reset_buckets_on_commit(tenant)
    return bool(deleted)
