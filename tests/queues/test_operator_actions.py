"""``queues.actions`` on chosen items and on whole sub-queues, against both backends."""

from __future__ import annotations

import pytest

from queues import actions
from queues.backends.database import DatabaseFIFO
from queues.models import QueueItem
from tests.queues.conftest import FakeClock

pytestmark = pytest.mark.django_db


def events(log) -> list[dict]:
    return [
        {"event": record.event, **record.fields} for record in log.records if getattr(record, "event", "")
    ]


def test_drop_sub_queue_of_main_steps_through_more_than_one_batch(queue, monkeypatch, queue_log):
    monkeypatch.setattr(actions, "BATCH", 3)
    queue.enqueue(*range(10))
    queue.claim()
    assert actions.drop_sub_queue(queue, "main") == 9
    assert (queue.length("main"), queue.length("busy")) == (0, 1)
    assert {
        "event": "queue_sub_queue_dropped_by_operator",
        "queue": "jobs",
        "backend": queue.backend,
        "kind": "main",
        "count": 9,
    } in events(queue_log)


def test_drop_sub_queue_of_main_leaves_items_enqueued_after_it_started(queue, make_queue, clock, monkeypatch):
    """While the walk runs, a consumer claims two of the items it set out to drop and a producer
    enqueues two more: the walk stops at the first item enqueued since it started."""
    monkeypatch.setattr(actions, "BATCH", 2)
    queue.enqueue(*range(6))
    ahead = FakeClock(clock.now)
    ahead.advance(seconds=1)
    others = make_queue(clock=ahead)
    drop_ids, steps = queue.drop_ids, []

    def drop_while_others_work(ids):
        dropped = drop_ids(ids)
        if not steps:
            others.claim(2)
            others.enqueue("new", "newer")
        steps.append(ids)
        return dropped

    monkeypatch.setattr(queue, "drop_ids", drop_while_others_work)
    assert actions.drop_sub_queue(queue, "main") == 4
    assert [item.payload for item in queue.peek("main", 5)] == ["new", "newer"]
    assert [item.payload for item in queue.peek("busy", 5)] == [2, 3]


def test_requeue_sub_queue_of_busy_leaves_claims_made_after_it_started(queue, make_queue, clock, monkeypatch):
    monkeypatch.setattr(actions, "BATCH", 2)
    queue.enqueue(*range(6))
    early = queue.claim(5)
    ahead = FakeClock(clock.now)
    ahead.advance(hours=1)
    queue.unclaim(early[-1])
    (late,) = make_queue(clock=ahead).claim()  # claimed "after" the operator's action starts
    assert actions.requeue_sub_queue(queue, "busy") == 4
    assert [item.id for item in queue.peek("busy", 5)] == [late.id]
    assert [item.payload for item in queue.peek("main", 10)] == [5, 0, 1, 2, 3]


def test_requeue_and_drop_of_failed_use_the_whole_failed_list(queue):
    queue.enqueue("a", "b", "c")
    for item in queue.claim(3):
        queue.fail(item, "boom")
    assert actions.requeue_sub_queue(queue, "failed") == 3
    for item in queue.claim(2):
        queue.fail(item, "boom")
    assert actions.drop_sub_queue(queue, "failed") == 2
    assert [item.payload for item in queue.peek("main", 5)] == ["c"]


@pytest.mark.parametrize("act", [actions.requeue_sub_queue, actions.drop_sub_queue])
def test_requeue_and_drop_of_failed_leave_items_that_failed_after_they_started(queue, make_queue, clock, act):
    queue.enqueue("early", "late")
    early, late = queue.claim(2)
    queue.fail(early, "boom")
    ahead = FakeClock(clock.now)
    ahead.advance(seconds=1)
    make_queue(clock=ahead).fail(late, "boom")  # failed "after" the operator's action starts
    assert act(queue, "failed") == 1
    assert [item.payload for item in queue.peek("failed", 5)] == ["late"]


def test_requeue_of_main_is_refused(queue):
    with pytest.raises(ValueError, match="waiting already"):
        actions.requeue_sub_queue(queue, "main")


def test_chosen_items_are_requeued_and_dropped_with_one_log_line_each(queue, queue_log):
    ids = queue.enqueue("a", "b", "c")
    queue.claim(2)
    assert actions.requeue_chosen(queue, ids) == 2
    assert actions.drop_chosen(queue, ids[:1]) == 1
    logged = [event for event in events(queue_log) if event["event"].endswith("by_operator")]
    assert logged == [
        {"event": "queue_items_requeued_by_operator", "queue": "jobs", "backend": queue.backend, "count": 2},
        {"event": "queue_items_dropped_by_operator", "queue": "jobs", "backend": queue.backend, "count": 1},
    ]


def test_chosen_database_items_of_two_queues_log_one_line_per_queue(db, queue_log):
    DatabaseFIFO("jobs").enqueue("a", "b")
    DatabaseFIFO("mail").enqueue("c")
    for name in ("jobs", "mail"):
        DatabaseFIFO(name).claim(2)
    assert actions.requeue_items(QueueItem.objects.all()) == 3
    assert actions.drop_items(QueueItem.objects.filter(queue="mail")) == 1
    logged = [event for event in events(queue_log) if event["event"].endswith("by_operator")]
    assert logged == [
        {"event": "queue_items_requeued_by_operator", "queue": "jobs", "backend": "database", "count": 2},
        {"event": "queue_items_requeued_by_operator", "queue": "mail", "backend": "database", "count": 1},
        {"event": "queue_items_dropped_by_operator", "queue": "mail", "backend": "database", "count": 1},
    ]
