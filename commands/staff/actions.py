"""What staff do to commands — approve, resend, cancel, make a new command — for the admin and the
REST API alike, which only collect the choice and show the answer.

Every action works on a queryset (a selection, or everything matching a filter) in two steps:

* :func:`plan` — the dry run: how many would change, and why the others would not, by eligibility
  ("40 will be resent, 12 need an override: 9 connector not idempotent, 3 outlook unknown"). One
  GROUP BY query, whatever the size of the selection; nothing is written.
* :func:`perform` — the same classification, applied: each change is a compare-and-set (an UPDATE
  whose WHERE repeats the eligibility), so of two people resending one command one wins, and a
  command that moved since the dry run is skipped, not changed. Writes one ``AuditEntry`` (who,
  when, what, reason, the commands, the result), also when nothing changed, and one log line.

**Resend** is a deliberate human act, and the one guard that matters is "never send a
non-idempotent command twice on its own". A resend does not send anything: it marks the command
(``resend_by``) and gives it a due time; the dispatch loop's sweep takes a marked command once,
whatever the retry decision would say, and the send's outcome clears the mark — so a resent
command that fails again waits for a person again. Bulk resends get due times spread at
``ANKUSA_RESEND_PER_S`` with jitter, so fixing a connector with 10,000 waiting commands does not
start a retry storm. Without an override only commands the machine itself could retry are resent
(a known outlook and an idempotent connector); a non-idempotent connector or an unknown outcome
needs ``override=True``, a typed reason and ``commands.resend_override_command``. A ``never``
command is not resent at all: sending the same instruction cannot work, so :func:`new_command`
makes a corrected copy instead.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from ankusa_site.core.logs import log_event
from commands import retry, wake
from commands.lifecycle import commands_queue
from commands.models import AuditEntry, Command

# The doors (admin, API) reach the dry run and the guards through this module, as they reach perform.
from commands.staff.plans import (  # noqa: F401
    ACTIONS,
    CHUNK,
    DONE_WORDS,
    MAX_REASON,
    OVERRIDE_PERMISSION,
    PERMISSIONS,
    WILL,
    Plan,
    Refused,
    _classify,
    _eligible,
    _needs_override,
    _phrase,
    _taken,
    check_permission,
    overridable,
    plan,
)
from commands.states import Event, State

logger = logging.getLogger("ankusa.commands.actions")


# --- performing ------------------------------------------------------------------------------------


@dataclass
class Done:
    action: str
    total: int
    done: int
    skipped: dict[str, int]
    audit: AuditEntry

    def summary(self) -> str:
        text = f"{self.done} {DONE_WORDS[self.action]}"
        if self.skipped:
            text += f"; {sum(self.skipped.values())} not: {_phrase(self.skipped)}"
        return text

    def as_dict(self) -> dict:
        return {
            "action": self.action,
            "total": self.total,
            "done": self.done,
            "skipped": self.skipped,
            "summary": self.summary(),
            "audit": self.audit.pk,
        }


def _clean_reason(reason: str, *, required: bool) -> str:
    reason = (reason or "").strip()
    if required and not reason:
        raise Refused("reason_required", "An override needs a reason: say why sending again is safe.")
    if len(reason) > MAX_REASON:
        raise Refused("reason_too_long", f"Keep the reason under {MAX_REASON} characters.")
    if "\x00" in reason:  # PostgreSQL's text holds none; the admin's form passes it through
        raise Refused("reason_invalid", "The reason holds a NUL character; type it again without one.")
    return reason


def nothing_to_do(action: str, counts: dict[str, int], *, user, override: bool) -> str:
    """Why an act would change nothing, and what would help (tick the override, ask an admin)."""
    guarded = {category: n for category, n in counts.items() if _needs_override(category)}
    rest = {category: n for category, n in counts.items() if category not in guarded}
    text = f"Nothing to {action}: none of the {sum(counts.values())} command(s) can be {DONE_WORDS[action]}"
    if guarded and not override:
        text += f"; {sum(guarded.values())} need an override ({_phrase(guarded)})"
        if user.has_perm(OVERRIDE_PERMISSION):
            text += ": tick the override and say why sending again is safe"
        else:
            text += (
                ": only someone with the override permission (the admin group) can resend them; ask an admin"
            )
    if rest:
        text += f"; {sum(rest.values())} cannot: {_phrase(rest)}"
    return text + "."


def perform(
    action: str,
    queryset,
    *,
    user,
    via: str,
    reason: str = "",
    override: bool = False,
    now: datetime | None = None,
    rng: random.Random | None = None,
) -> Done:
    """Run ``action`` on ``queryset``; see the module docstring. ``via``: "admin" or "api"."""
    override = override and overridable(action)
    check_permission(user, action, override=override)
    reason = _clean_reason(reason, required=override)
    now = now or timezone.now()
    counts = _classify(action, queryset)
    ids = list(queryset.filter(_eligible(action, override)).order_by("pk").values_list("pk", flat=True))
    if not ids:  # nothing to do is a refusal, not an act: no audit row
        raise Refused("nothing_to_do", nothing_to_do(action, counts, user=user, override=override))
    changed: list[int] = []
    due = {}
    if action == "resend":
        times = retry.resend_due_times(
            len(ids), now, per_second=settings.ANKUSA_RESEND_PER_S, rng=rng or random.Random()
        )
        due = dict(zip(ids, times, strict=True))
    with transaction.atomic():
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start : start + CHUNK]
            rows = Command.objects.filter(_eligible(action, override), pk__in=chunk)
            changed += _change(action, rows, user=user, now=now, due=due)
        if changed and action in ("resend", "approve"):
            # Due now: the commit wakes the dispatchers, whose sweep takes them (queues.wake).
            wake.commands_due(commands_queue())
        total = sum(counts.values())
        skipped = {category: n for category, n in counts.items() if category not in _taken(override)}
        raced = len(ids) - len(changed)
        if raced:
            skipped["changed meanwhile"] = raced
        entry = AuditEntry.objects.create(
            at=now,
            user=user,
            username=user.get_username(),
            action=AuditEntry.Action.RESEND_OVERRIDE if override else action,
            via=via,
            reason=reason,
            count=total,
            done=len(changed),
            result={"skipped": skipped},
        )
        link(entry, changed)
    result = Done(action, total, len(changed), skipped, entry)
    log_event(
        logger,
        DONE_WORDS[action],
        by=entry.username,
        via=via,
        count=total,
        done=len(changed),
        override=override,
        audit=entry.pk,
        commands=changed[:20],
    )
    return result


def link(entry: AuditEntry, ids: list[int]) -> None:
    """The entry's commands, in batches: a new entry links nothing yet, and ``commands.add`` would
    first look all of them up in one ``IN`` list, which SQLite refuses past 32,766 ids."""
    through = AuditEntry.commands.through
    through.objects.bulk_create(
        [through(auditentry_id=entry.pk, command_id=pk) for pk in ids], batch_size=CHUNK
    )


def _change(action: str, rows, *, user, now: datetime, due: dict) -> list[int]:
    """The CAS UPDATE of one chunk; returns the ids it changed (those still eligible)."""
    # Which rows the UPDATE will change: read under the same condition, locked where the database
    # can (SQLite's write transaction serialises writers already).
    winners = list(rows.select_for_update(of=("self",)).values_list("pk", flat=True))
    if not winners:
        return []
    rows = Command.objects.filter(pk__in=winners)
    if action == "approve":
        rows.transition(State.DRAFT, Event.APPROVE, now, approved_by=user, approved_at=now)
    elif action == "cancel":
        for state in (State.DRAFT, State.APPROVED, State.FAILED):
            rows.transition(state, Event.CANCEL, now, resend_by=None)
    else:
        _mark_resent(winners, due, user)
    return winners


TABLE = Command._meta.db_table
# Each command its own due time, in one statement per chunk: the pairs go as two arrays (PostgreSQL)
# or one JSON list (SQLite), where a CASE with a branch per row cost the ORM ~0.1 s per 500 rows.
MARK_SQL_POSTGRESQL = f"""
UPDATE {TABLE} AS command SET resend_by_id = %s, next_attempt_at = v.due, skip_reason = '',
    skip_decided_at = NULL
FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(id, due) WHERE command.id = v.id
"""
MARK_SQL = f"""
UPDATE {TABLE} SET resend_by_id = %s, next_attempt_at = v.due, skip_reason = '', skip_decided_at = NULL
FROM (SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS due FROM json_each(%s)) AS v
WHERE {TABLE}.id = v.id
"""


def _mark_resent(ids: list[int], due: dict[int, datetime], user) -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(MARK_SQL_POSTGRESQL, [user.pk, ids, [due[pk] for pk in ids]])
        else:
            stamp = connection.ops.adapt_datetimefield_value
            cursor.execute(MARK_SQL, [user.pk, json.dumps([[pk, stamp(due[pk])] for pk in ids])])


def new_command(
    original: Command,
    *,
    user,
    via: str,
    payload=None,
    reason: str = "",
    now: datetime | None = None,
) -> Command:
    """Cancel the failed ``original`` and make an approved copy of it (``payload`` replaced when
    given), linked by ``resent_from``. The copy is a new instruction: a new id, so a new
    ``Idempotency-Key`` at the receiver, and no REST idempotency key of its own."""
    check_permission(user, "new-command")
    reason = _clean_reason(reason, required=False)
    if payload is not None and not isinstance(payload, dict):
        raise Refused("invalid_payload", "The payload must be a JSON object.")
    now = now or timezone.now()
    with transaction.atomic():
        cancelled = Command.objects.filter(pk=original.pk).transition(
            State.FAILED, Event.CANCEL, now, resend_by=None
        )
        if not cancelled:
            raise Refused("not_failed", f"Command {original.pk} is not failed any more; reload it.")
        copy = Command.objects.create(
            tenant_id=original.tenant_id,
            connector_id=original.connector_id,
            source_id=original.source_id,
            delivery_id=original.delivery_id,
            idempotency_key=original.idempotency_key if original.source_id else "",
            payload=original.payload if payload is None else payload,
            state=State.APPROVED,
            state_changed_at=now,
            approved_by=user,
            approved_at=now,
            resent_from=original,
            created_at=now,
        )
        entry = AuditEntry.objects.create(
            at=now,
            user=user,
            username=user.get_username(),
            action=AuditEntry.Action.NEW_COMMAND,
            via=via,
            reason=reason,
            count=1,
            done=1,
            result={"original": original.pk, "new": copy.pk, "payload_changed": payload is not None},
        )
        entry.commands.add(original.pk, copy.pk)
    log_event(logger, "new_command", by=entry.username, via=via, original=original.pk, command=copy.pk)
    return copy
