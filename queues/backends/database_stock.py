"""The database queue's hot statements as the ORM writes them: the reference that
``ANKUSA_STOCK_DJANGO``'s ``sql`` layer turns ``queues.backends.database`` back to.

Same contract, same results (the queue tests run in both modes): ``enqueue`` places items at the
tail of main in order (positions from ``DatabaseFIFO._tail``: PostgreSQL's sequence, SQLite's
maximum), ``claim`` takes the head of main, skipping rows another consumer has locked, and
``done`` deletes only items still busy under the given claim, under row locks so a concurrent
recovery cannot slip in between. Slower than the hand-written SQL (more statements, model
instances per row); that is the point of keeping it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import F, JSONField, Value

from queues.fifo import Item
from queues.models import QueueItem

if TYPE_CHECKING:
    from queues.backends.database import DatabaseFIFO

State = QueueItem.State
BATCH = 1000  # rows per statement, as the hand-written path


def enqueue(queue: DatabaseFIFO, payloads: tuple[Any, ...], now: datetime) -> list[int]:
    with queue._atomic():  # joins the caller's transaction, as the hand-written statement does
        positions = queue._tail(len(payloads))
        rows = [
            QueueItem(
                queue=queue.name, state=State.MAIN, position=position, payload=_json(payload), enqueued_at=now
            )
            for position, payload in zip(positions, payloads, strict=True)
        ]
        QueueItem.objects.using(queue.using).bulk_create(rows, batch_size=BATCH)
    return [row.pk for row in rows]


def _json(payload: Any) -> Any:
    """``None`` as JSON's null: the field would store SQL NULL, which the column refuses."""
    return Value(None, JSONField()) if payload is None else payload


def claim(queue: DatabaseFIFO, n: int, now: datetime) -> list[Item]:
    main = queue._rows(State.MAIN)
    if not main.exists():
        return []  # an idle consumer's poll takes no lock
    with transaction.atomic(using=queue.using):
        head = main.order_by("position", "id").select_for_update(skip_locked=True)
        ids = list(head.values_list("id", flat=True)[:n])
        queue._rows().filter(pk__in=ids).update(state=State.BUSY, claimed_at=now, claims=F("claims") + 1)
        rows = list(queue._rows().filter(pk__in=ids).order_by("position", "id"))
    return [item_of(row) for row in rows]


def done(queue: DatabaseFIFO, claimed: list[tuple[int, int]], bare: list[int]) -> list[int]:
    """The ids deleted: those of ``claimed`` still busy under their claim, those of ``bare`` busy."""
    wanted: dict[int, int | None] = dict(claimed)
    wanted.update(dict.fromkeys(bare))  # an id also given bare is done whatever its claim, as in SQL
    held: list[int] = []
    ids = list(wanted)
    with queue._atomic():
        for offset in range(0, len(ids), BATCH):
            busy = queue._rows(State.BUSY).filter(pk__in=ids[offset : offset + BATCH]).select_for_update()
            found = [pk for pk, claims in busy.values_list("id", "claims") if wanted[pk] in (None, claims)]
            queue._rows().filter(pk__in=found).delete()
            held += found
    return held


def item_of(row: QueueItem) -> Item:
    """The contract's ``Item`` of a row (both branches of the database queue read rows this way)."""
    return Item(
        id=row.pk,
        payload=row.payload,
        enqueued_at=row.enqueued_at,
        claimed_at=row.claimed_at,
        requeue_count=row.requeue_count,
        fail_count=row.fail_count,
        last_error=row.last_error,
        claims=row.claims,
        failed_at=row.failed_at,
    )
