"""The dry run of a staff action on commands (:func:`plan`): how many would change, and why the
others would not, by eligibility — one GROUP BY query, nothing written — with the guards both steps
share (the actions, their permissions, :class:`Refused`). ``commands.staff.actions`` applies the
same classification (:func:`perform`); the doors reach both through it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.core.exceptions import PermissionDenied
from django.db.models import Case, CharField, Count, Q, Value, When

from commands.retry import Outlook
from commands.states import State

ACTIONS = ("approve", "resend", "cancel")
PERMISSIONS = {
    "approve": "commands.approve_command",
    "resend": "commands.resend_command",
    "cancel": "commands.cancel_command",
    "new-command": "commands.add_command",
}
OVERRIDE_PERMISSION = "commands.resend_override_command"
# Past participles for the summaries ("40 will be resent").
DONE_WORDS = {"approve": "approved", "resend": "resent", "cancel": "cancelled"}
# A CAS UPDATE covers at most this many ids (SQLite's parameter limit, a short lock).
CHUNK = 500
MAX_REASON = 2000


class Refused(Exception):
    """A request the guards refuse, for the person who made it (``code`` for machines)."""

    def __init__(self, code: str, detail: str):
        super().__init__(detail)
        self.code = code
        self.detail = detail


def check_permission(user, action: str, *, override: bool = False) -> None:
    """Raise ``PermissionDenied`` unless ``user`` may run ``action`` (with the override)."""
    wanted = [PERMISSIONS[action]] + ([OVERRIDE_PERMISSION] if override else [])
    if not getattr(user, "pk", None) or not user.has_perms(wanted):
        raise PermissionDenied(
            f"You may not {action.replace('-', ' ')}{' with an override' if override else ''}."
        )


# --- eligibility -----------------------------------------------------------------------------------
# Each action sorts a command into one category by a condition on its row. WILL: changes as asked;
# OVERRIDE: a resend only with an override; anything else: cannot, with the words for people.

WILL = "will"
NOT_IDEMPOTENT = "connector not idempotent"
UNKNOWN = "outlook unknown"  # the skip reason's own words (retry.SkipReason)
RETRYABLE = [Outlook.AGAIN.value, Outlook.AFTER_FIX.value]


def _categories(action: str) -> list[tuple[str, Q]]:
    """``(category, condition)`` in order: a command falls in the first whose condition holds; the
    last one's is empty (everything else)."""
    if action == "approve":
        return [(WILL, Q(state=State.DRAFT)), ("not a draft", Q())]
    if action == "cancel":
        return [
            (WILL, Q(state__in=[State.DRAFT, State.APPROVED, State.FAILED])),
            ("in flight: wait for its send to finish", Q(state__in=[State.QUEUED, State.DISPATCHING])),
            ("already finished", Q()),
        ]
    if action == "resend":
        return [
            ("not failed", ~Q(state=State.FAILED)),
            ("a resend is already pending", Q(resend_by__isnull=False)),
            ("never: make a new command instead", Q(last_outlook=Outlook.NEVER)),
            (UNKNOWN, ~Q(last_outlook__in=RETRYABLE)),
            (NOT_IDEMPOTENT, Q(connector__idempotent=False)),
            (WILL, Q()),
        ]
    raise ValueError(f"no action {action!r}; use one of {', '.join(ACTIONS)}")


def _needs_override(category: str) -> bool:
    return category in (NOT_IDEMPOTENT, UNKNOWN)


def _taken(override: bool) -> set[str]:
    """The categories an act changes."""
    return {WILL} | ({NOT_IDEMPOTENT, UNKNOWN} if override else set())


def _eligible(action: str, override: bool) -> Q:
    """The condition of the commands ``perform`` changes, repeated in every CAS UPDATE."""
    wanted = _taken(override)
    before, matched = Q(), Q(pk__in=[])
    for category, test in _categories(action):
        if category in wanted:
            matched |= before & test
        before &= ~test
    return matched


def _classify(action: str, queryset) -> dict[str, int]:
    *tested, (last, _) = _categories(action)
    whens = [When(test, then=Value(category)) for category, test in tested]
    rows = (
        queryset.order_by()
        .annotate(category=Case(*whens, default=Value(last), output_field=CharField()))
        .values("category")
        .annotate(n=Count("pk"))
    )
    return {row["category"]: row["n"] for row in rows}


def _phrase(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


@dataclass
class Plan:
    """A dry run: what :func:`perform` would do with the same arguments now."""

    action: str
    total: int
    will: int
    need_override: dict[str, int] = field(default_factory=dict)
    cannot: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        parts = [f"{self.will} will be {DONE_WORDS[self.action]}"]
        if self.need_override:
            parts.append(
                f"{sum(self.need_override.values())} need an override: {_phrase(self.need_override)}"
            )
        text = ", ".join(parts)
        if self.cannot:
            text += f"; {sum(self.cannot.values())} cannot: {_phrase(self.cannot)}"
        return text

    def overridden(self) -> Plan:
        """The same dry run with the override: what needed one will be done too (no query)."""
        return Plan(self.action, self.total, self.will + sum(self.need_override.values()), {}, self.cannot)

    def as_dict(self) -> dict:
        return {
            "action": self.action,
            "total": self.total,
            "will": self.will,
            "need_override": self.need_override,
            "cannot": self.cannot,
            "summary": self.summary(),
        }


def overridable(action: str) -> bool:
    """Whether ``action`` has guards an override lifts: only a resend (approve and cancel have
    none). An override asked for any other action is no override."""
    return action == "resend"


def plan(action: str, queryset, *, override: bool = False, user=None) -> Plan:
    """The dry run of ``action`` on ``queryset`` (one query; nothing written). With ``user``, only
    if that user may run it (a plan tells what the caller may do, not what others may)."""
    override = override and overridable(action)
    if user is not None:
        check_permission(user, action, override=override)
    counts = _classify(action, queryset)
    result = Plan(action, total=sum(counts.values()), will=counts.pop(WILL, 0))
    for category, n in counts.items():
        if _needs_override(category):
            if override:
                result.will += n
            else:
                result.need_override[category] = n
        else:
            result.cannot[category] = n
    return result
