"""The retry decision, branch by branch and at every boundary, exactly as the seed decides."""

from datetime import UTC, datetime, timedelta

import pytest

from commands.retry import AFTER_FIX_PERIOD, AGAIN_BACKOFF, Decision, SkipReason, decide

NOW = datetime(2026, 9, 2, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def ask(**given) -> Decision:
    inputs = {
        "dispatchable": True,
        "outlook": None,
        "attempts": 0,
        "next_attempt_at": None,
        "idempotent": True,
        "now": NOW,
    }
    inputs.update(given)
    return decide(**inputs)


def take(attempt: int, after: timedelta) -> Decision:
    return Decision(take=True, attempt=attempt, next_attempt_at=NOW + after)


def skip(reason: SkipReason) -> Decision:
    return Decision(take=False, skip=reason)


CASES = [
    # not dispatchable wins over everything, even a first attempt
    ("terminal state", {"dispatchable": False}, skip(SkipReason.NOT_DISPATCHABLE)),
    (
        "terminal, retry inputs",
        {"dispatchable": False, "attempts": 2, "outlook": "again"},
        skip(SkipReason.NOT_DISPATCHABLE),
    ),
    # first attempt: no outlook, no idempotency, no backoff asked
    ("first attempt", {}, take(1, 30 * S)),
    ("first attempt, not idempotent", {"idempotent": False}, take(1, 30 * S)),
    ("first attempt, idempotency unknown", {"idempotent": None}, take(1, 30 * S)),
    ("first attempt, due later", {"next_attempt_at": NOW + timedelta(hours=1)}, take(1, 30 * S)),
    ("first attempt, outlook never", {"outlook": "never"}, take(1, 30 * S)),
    ("attempts None is 0", {"attempts": None}, take(1, 30 * S)),
    ("negative attempts are 0", {"attempts": -3}, take(1, 30 * S)),
    ("attempts True is not a number", {"attempts": True}, take(1, 30 * S)),
    # a retry needs a known outlook
    ("retry, no outlook", {"attempts": 1}, skip(SkipReason.OUTLOOK_UNKNOWN)),
    ("retry, empty outlook", {"attempts": 1, "outlook": ""}, skip(SkipReason.OUTLOOK_UNKNOWN)),
    ("retry, unknown word", {"attempts": 1, "outlook": "later"}, skip(SkipReason.OUTLOOK_UNKNOWN)),
    ("retry, wrong case", {"attempts": 1, "outlook": "Again"}, skip(SkipReason.OUTLOOK_UNKNOWN)),
    (
        "outlook checked before idempotency",
        {"attempts": 1, "idempotent": False},
        skip(SkipReason.OUTLOOK_UNKNOWN),
    ),
    ("retry, never", {"attempts": 1, "outlook": "never"}, skip(SkipReason.NEVER)),
    (
        "never checked before idempotency",
        {"attempts": 1, "outlook": "never", "idempotent": False},
        skip(SkipReason.NEVER),
    ),
    # only an explicit True is idempotent
    (
        "retry, not idempotent",
        {"attempts": 1, "outlook": "again", "idempotent": False},
        skip(SkipReason.NOT_IDEMPOTENT),
    ),
    (
        "retry, idempotency unknown",
        {"attempts": 1, "outlook": "again", "idempotent": None},
        skip(SkipReason.NOT_IDEMPOTENT),
    ),
    (
        "retry, truthy is not True",
        {"attempts": 1, "outlook": "after-fix", "idempotent": 1},
        skip(SkipReason.NOT_IDEMPOTENT),
    ),
    (
        "idempotency checked before backoff",
        {"attempts": 1, "outlook": "again", "idempotent": False, "next_attempt_at": NOW + S},
        skip(SkipReason.NOT_IDEMPOTENT),
    ),
    # backoff: due exactly now is due; one microsecond early is not
    ("due exactly now", {"attempts": 1, "outlook": "again", "next_attempt_at": NOW}, take(2, 120 * S)),
    (
        "a microsecond early",
        {"attempts": 1, "outlook": "again", "next_attempt_at": NOW + timedelta(microseconds=1)},
        skip(SkipReason.BACKING_OFF),
    ),
    ("due in the past", {"attempts": 1, "outlook": "again", "next_attempt_at": NOW - S}, take(2, 120 * S)),
    ("no due time is now", {"attempts": 1, "outlook": "again", "next_attempt_at": None}, take(2, 120 * S)),
    (
        "ISO due time, later",
        {"attempts": 1, "outlook": "again", "next_attempt_at": "2026-09-02T12:00:01Z"},
        skip(SkipReason.BACKING_OFF),
    ),
    (
        "ISO due time, reached",
        {"attempts": 1, "outlook": "again", "next_attempt_at": "2026-09-02T12:00:00+00:00"},
        take(2, 120 * S),
    ),
    (
        "naive ISO is UTC",
        {"attempts": 1, "outlook": "again", "next_attempt_at": "2026-09-02T12:00:01"},
        skip(SkipReason.BACKING_OFF),
    ),
    (
        "unreadable due time does not block",
        {"attempts": 1, "outlook": "again", "next_attempt_at": "soon"},
        take(2, 120 * S),
    ),
    (
        "empty due time does not block",
        {"attempts": 1, "outlook": "again", "next_attempt_at": ""},
        take(2, 120 * S),
    ),
    (
        "backoff checked before attempts-spent",
        {"attempts": 3, "outlook": "again", "next_attempt_at": NOW + S},
        skip(SkipReason.BACKING_OFF),
    ),
    # again: 30 s, 2 min, 10 min, then spent
    ("again after attempt 1", {"attempts": 1, "outlook": "again"}, take(2, AGAIN_BACKOFF[1])),
    ("again after attempt 2", {"attempts": 2, "outlook": "again"}, take(3, AGAIN_BACKOFF[2])),
    ("again after attempt 3 is spent", {"attempts": 3, "outlook": "again"}, skip(SkipReason.ATTEMPTS_SPENT)),
    ("again after attempt 4 is spent", {"attempts": 4, "outlook": "again"}, skip(SkipReason.ATTEMPTS_SPENT)),
    # after-fix: every 10 min, never capped
    ("after-fix after attempt 1", {"attempts": 1, "outlook": "after-fix"}, take(2, AFTER_FIX_PERIOD)),
    ("after-fix after attempt 3", {"attempts": 3, "outlook": "after-fix"}, take(4, AFTER_FIX_PERIOD)),
    ("after-fix attempt 50", {"attempts": 49, "outlook": "after-fix"}, take(50, AFTER_FIX_PERIOD)),
    ("after-fix after attempt 50", {"attempts": 50, "outlook": "after-fix"}, take(51, AFTER_FIX_PERIOD)),
    (
        "after-fix backing off",
        {"attempts": 50, "outlook": "after-fix", "next_attempt_at": NOW + AFTER_FIX_PERIOD},
        skip(SkipReason.BACKING_OFF),
    ),
]


@pytest.mark.parametrize(("given", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decision_table(given, expected):
    assert ask(**given) == expected


def test_backoff_table_is_the_seeds():
    assert AGAIN_BACKOFF == (timedelta(seconds=30), timedelta(minutes=2), timedelta(minutes=10))
    assert AFTER_FIX_PERIOD == timedelta(minutes=10)


def test_again_schedule_end_to_end_is_30s_2min_10min_then_spent():
    now, due, schedule = NOW, None, []
    for attempts in range(4):
        decision = decide(
            dispatchable=True,
            outlook="again",
            attempts=attempts,
            next_attempt_at=due,
            idempotent=True,
            now=now,
        )
        if not decision.take:
            schedule.append(decision.skip)
            break
        schedule.append(decision.next_attempt_at - now)
        now = due = decision.next_attempt_at
    assert schedule == [*AGAIN_BACKOFF, SkipReason.ATTEMPTS_SPENT]


def test_skip_reasons_are_the_seeds_six():
    assert sorted(SkipReason.values) == sorted(
        ["not-dispatchable", "backing-off", "never", "attempts-spent", "outlook-unknown", "not-idempotent"]
    )
