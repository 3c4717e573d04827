"""A connector at a glance, for its list and its page: how it has been doing and what waits on it.

* **failing**: its failed commands; **waiting**: its commands not sent yet (approved or queued).
  Each is counted up to ``CAP`` (a sub-select with ``LIMIT CAP + 1`` over a partial index,
  ``commands_connector_failed_idx`` / ``commands_connector_waiting_idx``), so a connector with
  100,000 failed commands costs what one with 101 does, and a page of 100 connectors reads at most
  10,100 index entries; past it the list says "more than 100" and links to the failed list, which
  counts further.
* **last error and when**: the error of its most recently failed command (the failed index, newest
  state change first: one row read).
* **recent success rate** and the rest of a connector's health: ``commands.health``, read from
  its summary table, never from the attempts.

All of it is annotations or one query per page, never a query per row. What it does not do: count
past ``CAP``, or tell a connector that sent nothing recently from one that never worked (both "-").
"""

from __future__ import annotations

from django.db.models import OuterRef, Subquery
from django.db.models.expressions import RawSQL

from commands.models import Command
from commands.states import State

# At a glance, "more than 100" says what 4,000 would; the linked list counts up to 10,000.
CAP = 100
WAITING_STATES = (State.APPROVED.value, State.QUEUED.value)


def _capped_count(states: tuple[str, ...], order: str) -> RawSQL:
    # COUNT over a LIMITed sub-select: the count stops reading at CAP + 1 index entries. ``order``
    # is the partial index's own order, so the planner reads that index (a plain LIMIT may make it
    # prefer scanning the table, when most commands match the state). The states are written as
    # literals, not parameters: SQLite uses a partial index only when it can prove the query's
    # condition implies the index's, which a bound parameter hides. They are our own constants.
    assert all(state.isidentifier() for state in states), states
    table = Command._meta.db_table
    # One state as "=": SQLite does not read "IN ('failed')" as the index's "state = 'failed'".
    literals = ", ".join(f"'{state}'" for state in states)
    condition = f"c.state = {literals}" if len(states) == 1 else f"c.state IN ({literals})"
    return RawSQL(
        f"SELECT COUNT(*) FROM (SELECT 1 FROM {table} c WHERE c.connector_id = commands_connector.id "
        f"AND {condition} ORDER BY {order} LIMIT {CAP + 1}) capped",
        (),
    )


def annotate(queryset):
    """``queryset`` of connectors with ``failing``, ``waiting`` (each at most ``CAP + 1``), and
    ``last_error_class``, ``last_error``, ``last_failed_at`` of the newest failed command."""
    newest_failed = Command.objects.filter(connector=OuterRef("pk"), state=State.FAILED).order_by(
        "-state_changed_at"
    )
    return queryset.annotate(
        failing=_capped_count((State.FAILED.value,), "c.state_changed_at DESC"),  # connector_failed_idx
        waiting=_capped_count(WAITING_STATES, "c.connector_id"),  # connector_waiting_idx
        last_error_class=Subquery(newest_failed.values("last_error_class")[:1]),
        last_error=Subquery(newest_failed.values("last_error")[:1]),
        last_failed_at=Subquery(newest_failed.values("state_changed_at")[:1]),
    )


def capped(n: int | None) -> str:
    return f"more than {CAP:,}" if (n or 0) > CAP else str(n or 0)
