"""Why a command waits, in words: what its skip reason means and what a person can do about it.

The failed list (admin and API) shows one line per command from here, so "fix this" and "not our
side" read apart at a glance. ``after-fix`` is not a skip reason but an outlook: a command whose
adapter asked for a configuration fix explains itself by it while it waits (backing off between
checks, or not yet decided on).
"""

from __future__ import annotations

from dataclasses import dataclass

from commands.retry import AFTER_FIX_PERIOD, Outlook, SkipReason


@dataclass(frozen=True)
class Explanation:
    label: str
    meaning: str
    todo: str
    # For the badge: "fix" (a person must change something), "wait" (the machine will try again),
    # "person" (a person must decide: resend with an override, cancel, or make a new command).
    tone: str

    def line(self) -> str:
        return f"{self.meaning} — {self.todo}"


AFTER_FIX_MINUTES = int(AFTER_FIX_PERIOD.total_seconds() // 60)

SKIP_REASONS: dict[str, Explanation] = {
    Outlook.AFTER_FIX.value: Explanation(
        "after fix",
        "waiting for a configuration fix",
        f"edit the connector; it is re-checked every {AFTER_FIX_MINUTES} minutes and at once when you save",
        "fix",
    ),
    SkipReason.BACKING_OFF.value: Explanation(
        "backing off",
        "the receiver wobbled; the next try is scheduled",
        "nothing to do: it goes again at its next check",
        "wait",
    ),
    SkipReason.ATTEMPTS_SPENT.value: Explanation(
        "attempts spent",
        "three tries failed, so something other than a wobble is wrong",
        "look at the last error; resend once it is fixed, or cancel",
        "person",
    ),
    SkipReason.NEVER.value: Explanation(
        "never",
        "the receiver refused the instruction itself; sending it again cannot work",
        "make a new command with a corrected payload, or cancel",
        "person",
    ),
    SkipReason.NOT_IDEMPOTENT.value: Explanation(
        "not idempotent",
        "a retry could make two instructions: the connector did not declare idempotency",
        "check the receiver; resend with an override and a reason, or cancel",
        "person",
    ),
    SkipReason.OUTLOOK_UNKNOWN.value: Explanation(
        "outcome unknown",
        "whether it went out is unknown (the worker stopped, or the receiver gave no outlook)",
        "check the receiver; resend with an override and a reason if it did not arrive, or cancel",
        "person",
    ),
    SkipReason.NOT_DISPATCHABLE.value: Explanation(
        "not dispatchable",
        "its state does not allow a dispatch",
        "nothing to send; look at its state",
        "person",
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


def explain(command) -> Explanation | None:
    """The explanation of ``command``'s wait (anything with ``skip_reason`` and ``last_outlook``),
    or None when nothing holds it back."""
    return SKIP_REASONS.get(reason_key(command.skip_reason, command.last_outlook))
