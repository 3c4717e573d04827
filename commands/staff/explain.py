"""Why a command waits and what happens next, in words: the one source of them for the failed list,
the all-commands list, a command's page, the dashboard and the API (``why`` on a command).

:func:`explain` reads a command's row (its state, ``skip_reason``, ``last_outlook``, ``attempts``,
``next_attempt_at``, ``skip_decided_at``, ``resend_by_id``) and answers the reason, the next event,
who makes it (the machine, a person, nobody) and when: "the last of 3 tries failed; no tries left
— waits for a person from 13:40". Its rules follow ``commands.retry`` (the seed's decision):

* ``after-fix`` is an outlook, not a skip reason: a command whose adapter asked for a configuration
  fix explains itself by it while it backs off between checks or is not yet decided on.
* ``backing-off`` after an ``again`` failure is a wait before the next try only while tries are
  left (``len(AGAIN_BACKOFF)`` in all); after the last one it is the wait before
  ``attempts-spent``, and the words say so.
* A time the machine has passed without acting reads "at the next round", never a past time; a
  command nobody will check again has no next check.

:data:`SKIP_REASONS` keeps each reason's static label, meaning and tone, for a legend or a count.
* A command the machine would send but whose connector is paused or held (``commands.dispatch.hold``)
  waits for that (``paused``, by whom, why, since when; ``held`` during a receiver's outage, until a
  probe succeeds): read from its connector, which the lists load with it. One that waits for a
  person keeps its own reason: resuming would not send it.

What this does not do: read the attempts (a connector's change re-decides the stored reasons in the
same transaction, ``commands.staff.reconsider``); it may be a round stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import IntegerField, Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from commands.retry import AFTER_FIX_PERIOD, AGAIN_BACKOFF, Outlook, SkipReason
from commands.states import State

# How many tries an `again` failure gets in all: the first attempt and the retries after it.
AGAIN_TRIES = len(AGAIN_BACKOFF)
AFTER_FIX_MINUTES = int(AFTER_FIX_PERIOD.total_seconds() // 60)
RESEND_PENDING = "resend-pending"
PAUSED, HELD = "paused", "held"
AFTER_FIX = Outlook.AFTER_FIX.value

# Who makes the next event.
MACHINE, PERSON, NOBODY = "machine", "person", "nobody"


@dataclass(frozen=True)
class Meaning:
    """A reason's static words: its badge, what it means, what a person can do, and its tone —
    "fix" (a person must change something), "wait" (the machine will act), "person" (a person
    must decide: resend with an override, cancel, or make a new command)."""

    label: str
    meaning: str
    todo: str
    tone: str
    # Whether editing the connector can release the command (the page's fix hint appears only then).
    fix_helps: bool = False

    def line(self) -> str:
        return f"{self.meaning} — {self.todo}"


SKIP_REASONS: dict[str, Meaning] = {
    Outlook.AFTER_FIX.value: Meaning(
        "after fix",
        "the receiver asks for a configuration fix",
        f"edit the connector; saving it sends its after-fix commands within the dispatch poll, "
        f"else they are re-checked every {AFTER_FIX_MINUTES} minutes",
        "fix",
        fix_helps=True,
    ),
    SkipReason.BACKING_OFF.value: Meaning(
        "backing off",
        f"the receiver wobbled; it is tried again, {AGAIN_TRIES} tries in all",
        "nothing to do while tries are left; after the last one it waits for a person",
        "wait",
    ),
    SkipReason.ATTEMPTS_SPENT.value: Meaning(
        "attempts spent",
        f"all {AGAIN_TRIES} tries failed, so something other than a wobble is wrong",
        "look at the last error; resend once it is fixed, or cancel",
        "person",
    ),
    SkipReason.NEVER.value: Meaning(
        "never",
        "the receiver refused the instruction itself; sending it again cannot work",
        "make a new command with a corrected payload, or cancel",
        "person",
    ),
    SkipReason.NOT_IDEMPOTENT.value: Meaning(
        "not idempotent",
        "a retry could make two instructions: the connector did not declare idempotency",
        "check the receiver; declare the connector idempotent if it dedupes (its commands then go), "
        "or resend with an override and a reason, or cancel",
        "person",
        fix_helps=True,
    ),
    SkipReason.OUTLOOK_UNKNOWN.value: Meaning(
        "outlook unknown",
        "whether it went out is unknown (the worker stopped, or the receiver gave no outlook)",
        "check the receiver; resend with an override and a reason if it did not arrive, or cancel",
        "person",
    ),
    SkipReason.NOT_DISPATCHABLE.value: Meaning(
        "not dispatchable",
        "its state does not allow a dispatch",
        "nothing to send; look at its state",
        "person",
    ),
    RESEND_PENDING: Meaning(
        "resend pending",
        "a person resent it",
        "nothing to do: it goes once at its due time",
        "wait",
    ),
}

# Why a command waits for its connector rather than for itself (not skip reasons: nothing is
# written on the command, so they are not in the skip-reason filters).
CONNECTOR_STOPS: dict[str, Meaning] = {
    PAUSED: Meaning(
        "paused",
        "its connector is paused",
        "resume the connector (its commands then go at the resend rate)",
        "person",
    ),
    HELD: Meaning(
        "held",
        "its connector is held: the receiver failed many sends in a row",
        "nothing to do: a probe goes out now and then, and the first success sends the waiting "
        "commands at the resend rate; look at the receiver",
        "wait",
    ),
}


# The skip reasons under which an after-fix outlook explains the wait: none decided yet, or backing
# off between two checks. Any other reason (not idempotent, say) is what holds the command.
AFTER_FIX_REASONS = ("", SkipReason.BACKING_OFF.value)


def reason_key(skip_reason: str, last_outlook: str) -> str:
    """The key of ``SKIP_REASONS`` that explains a wait ("" when nothing holds it back)."""
    if last_outlook == Outlook.AFTER_FIX and skip_reason in AFTER_FIX_REASONS:
        return Outlook.AFTER_FIX.value
    return skip_reason


NO_REASON = "none"


def waits_for(skip_reason: str, last_outlook: str, resend_by=None) -> str:
    """The key of ``SKIP_REASONS`` that explains a wait, or ``NO_REASON`` (``explain``'s rule)."""
    if resend_by is not None:
        return RESEND_PENDING
    return reason_key(skip_reason, last_outlook) or NO_REASON


def waiting_for(reason: str) -> Q:
    """The rows :func:`waits_for` files under ``reason``: the filter behind a badge and a count."""
    if reason == RESEND_PENDING:
        return Q(resend_by__isnull=False)
    not_resent = Q(resend_by__isnull=True)
    after_fix = Q(last_outlook=AFTER_FIX, skip_reason__in=AFTER_FIX_REASONS)
    if reason == AFTER_FIX:
        return after_fix & not_resent
    value = "" if reason == NO_REASON else reason
    if value in AFTER_FIX_REASONS:
        return Q(skip_reason=value) & ~after_fix & not_resent
    return Q(skip_reason=value) & not_resent


# The failed list's default order: what needs a person first, then oldest first. A person's
# decision that could make two instructions (not idempotent, outlook unknown) before a spent retry
# schedule (``no tries left`` included), before a connector to fix, before ``never`` (a new command,
# often many rows of one bad batch), before what the machine still handles (backing off, a pending
# resend, not decided yet). The labels are shown above the list, in rank order.
URGENCY = [
    "a person decides (not idempotent, outlook unknown)",
    "no tries left (attempts spent)",
    "after fix",
    "never",
    "the machine's (backing off, resend pending, deciding)",
]


def _quoted(*values: str) -> str:
    return ", ".join(f"'{value}'" for value in values)  # constants of this module, never input


# The rank as SQL, :func:`waits_for`'s rule case by case. Literal text rather than a Case() with
# bound parameters: the index ``commands_failed_urgency_idx`` holds this very expression, and
# SQLite uses an index on an expression only for the same text (a bound parameter never matches),
# so the first page is an index range scan on 100,000 failed commands instead of a sort of them.
URGENCY_SQL = (
    "CASE WHEN resend_by_id IS NOT NULL THEN 4"
    f" WHEN skip_reason IN ({_quoted(SkipReason.NOT_IDEMPOTENT, SkipReason.OUTLOOK_UNKNOWN, SkipReason.NOT_DISPATCHABLE)}) THEN 0"
    f" WHEN skip_reason = '{SkipReason.ATTEMPTS_SPENT}' OR (skip_reason = '{SkipReason.BACKING_OFF}'"
    f" AND last_outlook <> '{AFTER_FIX}' AND attempts >= {AGAIN_TRIES}) THEN 1"
    f" WHEN last_outlook = '{AFTER_FIX}' AND skip_reason IN ({_quoted(*AFTER_FIX_REASONS)}) THEN 2"
    f" WHEN skip_reason = '{SkipReason.NEVER}' THEN 3"
    " ELSE 4 END"
)


def urgency() -> RawSQL:
    """The rank in :data:`URGENCY` of a failed command (0 first), as a query expression."""
    return RawSQL(URGENCY_SQL, [], output_field=IntegerField())


@dataclass(frozen=True)
class Explanation:
    """Why one command waits and what happens next. ``key``: the filter it is listed under (a key
    of ``SKIP_REASONS``, or "" when nothing holds it back); ``by``: who makes the next event
    (``machine``, ``person``, ``nobody``); ``at``: when — the machine's next check (None: at its
    next round), or since when it waits for a person."""

    key: str
    label: str
    reason: str
    next: str
    by: str
    at: datetime | None
    todo: str
    tone: str
    fix_helps: bool = False
    # When the machine acts at no set time: the next round (the sweep), or the next poll (queued).
    soon: str = "at the next round"

    @property
    def next_check(self) -> datetime | None:
        """When the machine looks at it again; None when only a person can move it, or at the next round."""
        return self.at if self.by == MACHINE else None

    def when(self) -> str:
        if self.by == PERSON:
            return f" from {stamp(self.at)}" if self.at else ""
        if self.by == MACHINE:
            return f" at {stamp(self.at)}" if self.at else f" {self.soon}"
        return ""

    def line(self) -> str:
        """The reason, the next event and when, in one line: "the last of 3 tries failed; no tries
        left — waits for a person from 2026-12-01 13:40 UTC"."""
        return f"{self.reason} — {self.next}{self.when()}"

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "label": self.label,
            "reason": self.reason,
            "next": self.next,
            "by": self.by,
            "at": self.at,
            "next_check": self.next_check,
            "todo": self.todo,
            "text": self.line(),
        }


def stamp(moment: datetime) -> str:
    """A moment as the explanations say it: to the minute, in the site's time zone, named."""
    local = timezone.localtime(moment)
    return f"{local:%Y-%m-%d %H:%M} {local.tzname() or settings.TIME_ZONE}"


def _ahead(moment: datetime | None, now: datetime) -> datetime | None:
    """A due time still ahead, or None: one the machine has passed is "at the next round"."""
    return moment if moment is not None and moment > now else None


def _from(meaning: Meaning, key: str, *, reason: str, next: str, by: str, at=None, **words) -> Explanation:
    return Explanation(
        key=key,
        label=words.get("label", meaning.label),
        reason=reason,
        next=next,
        by=by,
        at=at,
        todo=words.get("todo", meaning.todo),
        tone=words.get("tone", meaning.tone),
        fix_helps=meaning.fix_helps,
    )


def _state(command, now: datetime) -> Explanation:
    """A command that is not failed: the state says it all."""
    state = State(command.state)
    if state == State.DRAFT:
        return Explanation(
            "",
            "draft",
            "a draft",
            "waits for a person to approve it",
            PERSON,
            None,
            "approve it, or cancel",
            "person",
        )
    if state == State.APPROVED:
        attempt = "its first attempt" if not command.attempts else "its next attempt"
        return Explanation(
            "",
            "approved",
            f"approved, {attempt} not made yet",
            "sent",
            MACHINE,
            _ahead(command.next_attempt_at, now),
            "nothing to do",
            "wait",
        )
    if state == State.QUEUED:
        return Explanation("", "queued", "queued for its send", "sent", MACHINE, None, "nothing to do", "wait",
                           soon="at the next dispatch poll")  # fmt: skip
    if state == State.DISPATCHING:
        return Explanation("", "dispatching", "being sent", "its outcome is recorded when the send ends",
                           NOBODY, None, "nothing to do", "wait")  # fmt: skip
    return Explanation(
        "",
        state.label,
        f"{state.label}: finished",
        "nothing happens any more",
        NOBODY,
        None,
        "nothing to do",
        "none",
    )


def _stopped(command, explained: Explanation) -> Explanation | None:
    """The wait for a paused or held connector of a command the machine would send, else None."""
    if command.state not in (State.APPROVED, State.QUEUED, State.FAILED) or explained.by != MACHINE:
        return None
    connector = command.connector
    if connector.paused_at is not None:
        meaning = CONNECTOR_STOPS[PAUSED]
        # Who paused it is on the connector's page and in the audit: a list loads no user per row.
        return _from(meaning, PAUSED, reason=f"{meaning.meaning}: {connector.pause_reason}",
                     next="waits for a person to resume it", by=PERSON, at=connector.paused_at)  # fmt: skip
    if connector.held_since is not None:
        meaning = CONNECTOR_STOPS[HELD]
        return _from(meaning, HELD, reason=f"{meaning.meaning} (since {stamp(connector.held_since)})",
                     next="the next probe goes out", by=MACHINE, at=connector.probe_at)  # fmt: skip
    return None


def explain(command, now: datetime | None = None) -> Explanation:
    """Why ``command`` waits and what happens next (see the module docstring)."""
    now = now or timezone.now()
    explained = _explain(command, now)
    return _stopped(command, explained) or explained


def _explain(command, now: datetime) -> Explanation:
    if command.state != State.FAILED:
        return _state(command, now)
    if getattr(command, "resend_by_id", None) is not None:
        meaning = SKIP_REASONS[RESEND_PENDING]
        return _from(
            meaning,
            RESEND_PENDING,
            reason=meaning.meaning,
            next="goes once",
            by=MACHINE,
            at=_ahead(command.next_attempt_at, now),
        )
    key = reason_key(command.skip_reason, command.last_outlook)
    decided = command.skip_decided_at
    if key == Outlook.AFTER_FIX:
        meaning = SKIP_REASONS[key]
        return _from(
            meaning,
            key,
            reason=meaning.meaning,
            next="checked again",
            by=MACHINE,
            at=_ahead(command.next_attempt_at, now),
        )
    if key == SkipReason.BACKING_OFF:
        meaning = SKIP_REASONS[key]
        if command.attempts >= AGAIN_TRIES:
            # The last backoff step is a wait before attempts-spent, not a fourth try (the seed).
            return _from(
                meaning,
                key,
                label="no tries left",
                reason=f"the last of {AGAIN_TRIES} tries failed; no tries left",
                next="waits for a person",
                by=PERSON,
                at=command.next_attempt_at or decided,
                todo=SKIP_REASONS[SkipReason.ATTEMPTS_SPENT].todo,
                tone="person",
            )
        return _from(
            meaning,
            key,
            reason=f"try {command.attempts} of {AGAIN_TRIES} failed: the receiver wobbled",
            next=f"try {command.attempts + 1} of {AGAIN_TRIES} is made",
            by=MACHINE,
            at=_ahead(command.next_attempt_at, now),
            todo="nothing to do",
        )
    if key in SKIP_REASONS:
        meaning = SKIP_REASONS[key]
        return _from(meaning, key, reason=meaning.meaning, next="waits for a person", by=PERSON, at=decided)
    return Explanation(
        "",
        "deciding",
        "failed; not decided on yet",
        "decided",
        MACHINE,
        _ahead(command.next_attempt_at, now),
        "nothing to do",
        "wait",
    )
