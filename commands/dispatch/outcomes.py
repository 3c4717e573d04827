"""Writing finished sends: :func:`record_outcomes` writes their attempt rows and next states and
finishes their queue items in one transaction, then reports them (log line, metrics) once committed.

Guaranteed: an outcome that arrives after recovery took its send for lost replaces the guess only while
nothing has acted on it; an outcome for a command that moved on since is counted ``stale``, not written.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from datetime import datetime

from django.db import connection, transaction

from ankusa_site.core import metrics
from ankusa_site.core.logs import log_event
from ankusa_site.core.stock import stock
from commands import health
from commands.dispatch import hold
from commands.dispatch.sends import Sent
from commands.dispatch.statements import (
    finish_in_one,
    finish_recovered,
    finish_sends,
    finish_with_attempts,
    insert_attempts,
)
from commands.lifecycle import decide_for, with_commit
from commands.states import Event, State
from queues.fifo import Item, ReliableFIFO

logger = logging.getLogger("ankusa.commands.dispatch")


def _next_state(sent: Sent) -> tuple[str, dict]:
    """The event and the fields a finished send writes on its command."""
    outcome = sent.outcome
    if outcome.ok:
        return Event.SUCCEED, {
            "resend_by": None,
            "last_outlook": "",
            "last_error_class": "",
            "last_error": "",
            "next_attempt_at": None,
            "skip_reason": "",
            "skip_decided_at": None,
        }
    # Decide at once, so the failed list shows why it waits from the first moment.
    decision = decide_for(
        {
            "state": State.FAILED,
            "last_outlook": outcome.outlook,
            "attempts": sent.attempt,
            "next_attempt_at": sent.command.next_attempt_at,
            "connector__idempotent": sent.command.connector.idempotent,
        },
        sent.finished,
    )
    # A resend is spent by its send: another failure waits for a person again.
    return Event.FAIL, {
        "resend_by": None,
        "last_outlook": outcome.outlook or "",
        "last_error_class": outcome.error_class,
        "last_error": outcome.detail,
        "skip_reason": decision.skip or "",
        "skip_decided_at": sent.finished,
    }


def record_outcomes(
    sent: list[Sent], now: datetime, *, queue: ReliableFIFO | None = None, items: tuple[Item, ...] = ()
) -> Counter:
    """Write the attempt rows and the next states of finished sends, and finish their queue items,
    in one transaction (the items after it on a queue outside the database). Returns a count of
    the states reached.

    Attempt rows are written once, complete; a send that never reports back gets its row from
    :func:`recover` instead. Commands whose changes are identical (every success of one attempt
    number, say) move in one UPDATE.
    """
    try:
        return _record(sent, now, queue, items, together=True)
    except _Recovered:
        return _record(sent, now, queue, items, together=False)


class _Recovered(Exception):
    """A group of finished sends did not move whole: some were recovered while in flight."""


def _record(sent: list[Sent], now: datetime, queue, items, *, together: bool) -> Counter:
    results: Counter = Counter()
    groups: dict[tuple, list[Sent]] = defaultdict(list)
    for one in sent:
        event, changes = _next_state(one)
        groups[event, one.attempt, tuple(sorted(changes.items()))].append(one)
    with transaction.atomic():
        if together and sent and connection.vendor == "postgresql" and not stock("sql"):
            recorded = _in_one_statement(sent, groups, now, queue, items)
        else:
            recorded = _in_statements(groups, now, queue, items, together, results)
        results.update(State.SUCCEEDED.value if one.outcome.ok else State.FAILED.value for one in recorded)
        transaction.on_commit(lambda: report_sends(recorded))
    return results


def _in_one_statement(sent: list[Sent], groups: dict, now: datetime, queue, items) -> list[Sent]:
    """The batch's moves and attempt rows, its health summary, its queue items' end (when the queue
    can join) and the hold's look, as one statement (``statements.finish_in_one``); then the hold's
    writes, if any. Raises ``_Recovered`` if a group did not move whole."""
    done = queue.done_in_statement(*items) if items else None
    moved, finished, failing = finish_in_one(
        [(group, attempt, event, dict(changes)) for (event, attempt, changes), group in groups.items()],
        now,
        health.in_statement(sent),
        None if done is None else done[:2],
        hold.to_look(sent),
    )
    # Only recover() competes for a dispatching row, and only after the visibility timeout: the
    # batch is written whole, or redone row by row.
    if moved != [len(group) for group in groups.values()]:
        raise _Recovered
    hold.observe(sent, now, failing=failing)
    if done is not None:
        _, _, report_done = done
        report_done(finished)
    elif items:
        with_commit(queue, lambda: queue.done(*items))
    return sent


def _in_statements(groups: dict, now: datetime, queue, items, together: bool, results: Counter) -> list[Sent]:
    """The batch as a statement or two for each part (SQLite, ``ANKUSA_STOCK_DJANGO``'s ``sql``
    layer, and row by row after a recovery). Counts the stale outcomes in ``results``."""
    recorded: list[Sent] = []
    for (event, attempt, changes), group in groups.items():
        if together:
            # As in _in_one_statement: the group moves whole, with its attempt rows, or the batch is
            # redone row by row.
            if finish_with_attempts(group, attempt, event, now, dict(changes)) != len(group):
                raise _Recovered
            recorded.extend(group)
            continue
        for one in group:
            if finish_sends([one.command.pk], attempt, event, now, dict(changes)):
                recorded.append(one)
            elif finish_recovered(one.command.pk, attempt, event, now, dict(changes)):
                # Recovered as lost while its outcome waited to be written (an outage outlasting
                # the visibility timeout, a spool written back late): the outcome is what is
                # known, so it replaces the guess.
                log_event(logger, "recorded_after_recovery", command=one.command.pk, attempt=attempt)
                recorded.append(one)
            else:
                # Moved on since (resent, cancelled, or recovered and retried): the outcome is stale.
                logger.warning(
                    "command %s was recovered while attempt %s was in flight", one.command.pk, attempt
                )
                results["stale"] += 1
    if not together:
        insert_attempts(recorded)
    # The summary before the hold, in either way of writing: every recorder locks a connector's
    # health row before the connector's own row.
    health.record(recorded)  # the connector health summary, in the same transaction
    hold.observe(recorded, now)  # outage holds: counted with the outcomes they count
    if items:
        with_commit(queue, lambda: queue.done(*items))
    return recorded


def report_sends(recorded: list[Sent]) -> None:
    """One log line per stored send (``dispatched`` or ``dispatch_failed`` with its outlook), and
    ``ankusa_dispatch_attempts_total`` / ``_latency_seconds`` — once the outcomes are committed."""
    for one in recorded:
        kind = one.command.connector.kind
        outcome, seconds = one.outcome, (one.finished - one.started).total_seconds()
        metrics.labelled(
            metrics.DISPATCH_ATTEMPTS, kind, "ok" if outcome.ok else "failed", outcome.outlook or ""
        ).inc()
        metrics.labelled(metrics.DISPATCH_LATENCY, kind).observe(seconds)
        fields = {"command": one.command.pk, "connector": one.command.connector_id, "attempt": one.attempt}
        if outcome.ok:
            log_event(logger, "dispatched", **fields, status=outcome.status, ms=round(seconds * 1000, 1))
        else:
            log_event(
                logger,
                "dispatch_failed",
                level=logging.WARNING,
                **fields,
                status=outcome.status,
                outlook=outcome.outlook or "unknown",
                error_class=outcome.error_class,
            )
