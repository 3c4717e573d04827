"""The contract of ``queues.fifo.ReliableFIFO``, run unchanged against every backend.

The ``backend`` fixture runs each test on the database backend (SQLite or PostgreSQL, whichever
this run's ``DATABASE_URL`` names) and on Redis.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import connections

from queues.fifo import Item

pytestmark = pytest.mark.django_db


def lost_claims(log) -> list[dict]:
    return [record.fields for record in log.records if getattr(record, "event", "") == "queue_claim_lost"]


def in_thread(function, *args):
    """``function(*args)`` for another thread, closing that thread's database connection after."""

    def run():
        try:
            function(*args)
        finally:
            connections.close_all()

    return run


# --- enqueue and claim ------------------------------------------------------------------------------


def test_enqueue_returns_increasing_ids_and_fills_main(queue):
    ids = queue.enqueue({"n": 1}, {"n": 2}, {"n": 3})
    assert len(ids) == 3
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (3, 0, 0)


def test_enqueue_of_nothing_is_nothing(queue):
    assert queue.enqueue() == []
    assert queue.length() == 0


def test_claims_follow_enqueue_order_across_single_and_batch_claims(queue):
    ids = queue.enqueue(*range(10))
    queue.enqueue(10)
    claimed = queue.claim() + queue.claim(3) + queue.claim() + queue.claim(100)
    assert [item.payload for item in claimed] == list(range(11))
    assert [item.id for item in claimed][:10] == ids


def test_claim_moves_items_to_busy_with_claim_time_and_claim_number(queue, clock):
    (pk,) = queue.enqueue({"a": 1})
    clock.advance(seconds=7)
    (item,) = queue.claim()
    assert item == Item(
        id=pk,
        payload={"a": 1},
        enqueued_at=clock.now - timedelta(seconds=7),
        claimed_at=clock.now,
        claims=1,
    )
    assert (queue.length("main"), queue.length("busy")) == (0, 1)


def test_claim_returns_fewer_when_fewer_are_ready(queue):
    queue.enqueue("a", "b")
    assert [item.payload for item in queue.claim(5)] == ["a", "b"]
    assert queue.claim(5) == []


def test_claim_of_an_empty_queue_returns_at_once_without_wait(queue):
    started = time.monotonic()
    assert queue.claim() == []
    assert time.monotonic() - started < 0.5


def test_claim_with_wait_gives_up_after_the_wait(queue):
    started = time.monotonic()
    assert queue.claim(wait=0.3) == []
    assert 0.3 <= time.monotonic() - started < 1.5


def test_claim_with_wait_returns_an_item_enqueued_while_it_waits(transactional_db, make_queue):
    consumer, producer = make_queue(), make_queue()
    timer = threading.Timer(0.3, in_thread(producer.enqueue, "late"))
    started = time.monotonic()
    timer.start()
    try:
        items = consumer.claim(wait=5)
    finally:
        timer.join()
    assert [item.payload for item in items] == ["late"]
    assert 0.3 <= time.monotonic() - started < 2


def test_claim_needs_a_positive_count(queue):
    with pytest.raises(ValueError):
        queue.claim(0)


def test_identical_payloads_are_two_items(queue):
    first, second = queue.enqueue({"same": True}, {"same": True})
    assert first != second
    a, b = queue.claim(2)
    assert queue.done(a) == 1
    assert queue.length("busy") == 1
    assert queue.peek("busy") == [b]


@pytest.mark.parametrize(
    "payload",
    [
        None,
        0,
        -7,
        3.5,
        "text",
        "ünïcödé ✓",
        "not a NUL: \\u0000",
        [],
        {},
        [1, "two", None],
        {"nested": {"list": [1, {"k": "v"}]}},
    ],
)
def test_json_payloads_come_back_equal(queue, payload):
    queue.enqueue(payload)
    (item,) = queue.claim()
    assert item.payload == payload
    assert type(item.payload) is type(payload)


@pytest.mark.parametrize("payload", [{1, 2}, object(), float("nan"), b"bytes"])
def test_a_payload_json_cannot_carry_is_refused_and_nothing_is_enqueued(queue, payload):
    with pytest.raises(ValueError, match="must be JSON"):
        queue.enqueue("fine", payload)
    assert queue.length() == 0


@pytest.mark.parametrize("payload", ["a\x00b", {"k\x00": 1}, "\\\x00", "\ud800", {"k": ["\udfff"]}])
def test_a_payload_some_backend_cannot_store_is_refused_by_every_backend(queue, payload):
    with pytest.raises(ValueError, match="every backend can store"):
        queue.enqueue("fine", payload)
    assert queue.length() == 0


# --- done -------------------------------------------------------------------------------------------


def test_done_removes_items_from_the_queue(queue):
    queue.enqueue("a", "b", "c")
    items = queue.claim(3)
    assert queue.done(*items[:2]) == 2
    assert queue.peek("busy", 5) == items[2:]
    assert queue.done(items[2].id) == 1
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (0, 0, 0)


def test_done_twice_finishes_once(queue, queue_log):
    queue.enqueue("a")
    (item,) = queue.claim()
    assert queue.done(item) == 1
    assert queue.done(item) == 0
    assert lost_claims(queue_log) == [{"queue": "jobs", "operation": "done", "skipped": 1, "ids": [item.id]}]


def test_done_of_an_item_not_claimed_is_a_noop(queue):
    (pk,) = queue.enqueue("a")
    assert queue.done(pk) == 0
    assert queue.length("main") == 1


def test_done_after_expiry_and_a_new_claim_is_a_noop_that_reports_it(queue, clock, queue_log):
    queue.enqueue("job")
    (stale,) = queue.claim()
    clock.advance(minutes=10)
    assert [item.id for item in queue.handle_expired(timedelta(minutes=5))] == [stale.id]
    (fresh,) = queue.claim()
    assert fresh.id == stale.id and fresh.claims == stale.claims + 1

    assert queue.done(stale) == 0
    assert queue.requeue(stale) == 0
    assert queue.fail(stale, "late") is False
    assert queue.unclaim(stale) == 0
    assert queue.peek("busy") == [fresh]
    assert [fields["operation"] for fields in lost_claims(queue_log)] == [
        "done",
        "requeue",
        "fail",
        "unclaim",
    ]
    assert queue.done(fresh) == 1
    assert queue.length("busy") == 0


def test_a_stale_item_in_a_batch_done_is_skipped_and_the_rest_finish(queue, clock, queue_log):
    queue.enqueue("stale", "a", "b")
    (stale,) = queue.claim()
    clock.advance(minutes=10)
    queue.handle_expired(timedelta(minutes=5))
    fresh = queue.claim(3)  # the stale item again (at the tail), then a and b
    assert [item.payload for item in fresh] == ["a", "b", "stale"]
    assert queue.done(stale, fresh[0], fresh[1]) == 2
    assert queue.peek("busy", 5) == [fresh[2]]
    assert lost_claims(queue_log) == [{"queue": "jobs", "operation": "done", "skipped": 1, "ids": [stale.id]}]


def test_done_takes_items_and_bare_ids_together(queue):
    queue.enqueue("a", "b", "c")
    a, b, c = queue.claim(3)
    assert queue.done(a, b.id, 10**9) == 2
    assert queue.peek("busy", 5) == [c]


def test_done_of_more_items_than_one_statement_carries_finishes_every_held_one(queue, clock):
    ids = queue.enqueue(*range(2100))
    first = queue.claim(1)
    clock.advance(minutes=10)
    queue.handle_expired(timedelta(minutes=5))  # the first item goes to the tail, its claim stale
    items = queue.claim(2100)
    assert [item.payload for item in items] == [*range(1, 2100), 0]
    assert queue.done(*first, *items) == 2100
    assert (queue.length("main"), queue.length("busy")) == (0, 0)
    assert sorted(item.id for item in items) == ids


def test_done_and_claim_finishes_items_and_claims_the_next_in_order(queue, queue_log):
    queue.enqueue("a", "b", "c", "d")
    first = queue.claim(2)
    second = queue.done_and_claim(*first, n=5)
    assert [item.payload for item in second] == ["c", "d"]
    assert queue.peek("busy", 5) == second
    assert queue.done_and_claim(*first, *second) == []
    assert lost_claims(queue_log) == [
        {"queue": "jobs", "operation": "done", "skipped": 2, "ids": sorted(item.id for item in first)}
    ]
    assert (queue.length("main"), queue.length("busy")) == (0, 0)


# --- requeue, unclaim, fail -------------------------------------------------------------------------


def test_requeue_puts_items_at_the_tail_and_counts(queue):
    queue.enqueue("a", "b", "c")
    (a,) = queue.claim()
    assert queue.requeue(a, error="timeout") == 1
    items = queue.claim(3)
    assert [item.payload for item in items] == ["b", "c", "a"]
    assert (items[2].requeue_count, items[2].last_error) == (1, "timeout")


def test_requeue_to_the_front_puts_items_at_the_head_in_order(queue):
    queue.enqueue("a", "b", "c", "d")
    a, b = queue.claim(2)
    assert queue.requeue(a, b, front=True) == 2
    items = queue.claim(4)
    assert [item.payload for item in items] == ["a", "b", "c", "d"]
    assert [item.requeue_count for item in items] == [1, 1, 0, 0]


def test_an_item_goes_to_failed_past_the_requeue_limit_keeping_the_error(make_queue, clock):
    queue = make_queue(requeue_limit=2)
    queue.enqueue("flaky")
    for attempt in range(2):
        (item,) = queue.claim()
        assert queue.requeue(item, error=f"attempt {attempt}") == 1
        assert queue.length("main") == 1
    (item,) = queue.claim()
    assert item.requeue_count == 2
    assert queue.requeue(item, error="attempt 2") == 1
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (0, 0, 1)
    (failed,) = queue.peek("failed")
    assert (failed.id, failed.last_error, failed.fail_count, failed.requeue_count) == (
        item.id,
        "attempt 2",
        1,
        2,
    )
    assert failed.failed_at == clock.now


def test_a_requeue_limit_of_zero_fails_on_the_first_requeue(make_queue):
    queue = make_queue(requeue_limit=0)
    queue.enqueue("x")
    queue.requeue(*queue.claim())
    (failed,) = queue.peek("failed")
    assert failed.last_error == "requeue limit of 0 reached"


def test_unclaim_puts_items_back_at_the_head_uncounted(queue):
    queue.enqueue("a", "b", "c")
    a, b = queue.claim(2)
    assert queue.unclaim(a, b) == 2
    items = queue.claim(3)
    assert [item.payload for item in items] == ["a", "b", "c"]
    assert [item.requeue_count for item in items] == [0, 0, 0]
    assert [item.claims for item in items] == [2, 2, 1]


def test_fail_moves_a_busy_item_to_failed_with_the_error(queue, clock):
    queue.enqueue("a", "b")
    a, b = queue.claim(2)
    clock.advance(seconds=3)
    assert queue.fail(a, "connector said no") is True
    (failed,) = queue.peek("failed")
    assert (failed.id, failed.payload, failed.last_error, failed.fail_count) == (
        a.id,
        "a",
        "connector said no",
        1,
    )
    assert failed.failed_at == clock.now and failed.claimed_at is None
    assert queue.peek("busy") == [b]


def test_fail_of_an_item_not_busy_returns_false(queue):
    (pk,) = queue.enqueue("a")
    assert queue.fail(pk, "nope") is False
    assert queue.length("failed") == 0


def test_an_error_with_separators_and_unicode_comes_back_verbatim(queue):
    error = 'HTTP 503: "upstream: down" 12:30 — réessayer\nline two'
    queue.enqueue({"k": "v:1"})
    queue.requeue(*queue.claim(), error=error)
    (item,) = queue.claim()
    assert (item.last_error, item.payload) == (error, {"k": "v:1"})


def test_a_long_error_is_cut(queue):
    queue.enqueue("a")
    queue.fail(*queue.claim(), "x" * 10_000)
    assert len(queue.peek("failed")[0].last_error) == 2000


# --- the failed list --------------------------------------------------------------------------------


def _fail_all(queue, error="boom"):
    for item in queue.claim(100):
        queue.fail(item, error)


def test_requeue_failed_moves_them_to_the_tail_in_failure_order_with_a_fresh_count(make_queue):
    queue = make_queue(requeue_limit=1)
    queue.enqueue("f1", "f2")
    f1, f2 = queue.claim(2)
    queue.requeue(f2)
    queue.fail(f1, "x")
    queue.requeue(*queue.claim())  # f2 past its limit -> failed after f1
    queue.enqueue("waiting")
    assert queue.requeue_failed() == 2
    assert queue.length("failed") == 0
    items = queue.claim(3)
    assert [item.payload for item in items] == ["waiting", "f1", "f2"]
    assert [item.requeue_count for item in items] == [0, 0, 0]
    assert [item.fail_count for item in items] == [0, 1, 1]


def test_requeue_failed_leaves_items_that_failed_too_often(queue):
    queue.enqueue("twice")
    _fail_all(queue)
    queue.requeue_failed()
    queue.enqueue("once")
    _fail_all(queue)
    assert [(item.payload, item.fail_count) for item in queue.peek("failed", 5)] == [
        ("twice", 2),
        ("once", 1),
    ]
    assert queue.requeue_failed(max_fail_count=1) == 1
    assert [item.payload for item in queue.peek("main", 5)] == ["once"]
    assert [item.payload for item in queue.peek("failed", 5)] == ["twice"]


def test_requeue_failed_with_a_delay_takes_only_items_that_failed_long_enough_ago(queue, clock):
    queue.enqueue("old")
    _fail_all(queue)
    clock.advance(minutes=10)
    queue.enqueue("new")
    _fail_all(queue)
    assert queue.requeue_failed(delay=timedelta(minutes=5)) == 1
    assert [item.payload for item in queue.peek("main")] == ["old"]
    assert [item.payload for item in queue.peek("failed")] == ["new"]


def test_requeue_failed_respects_a_limit(queue):
    queue.enqueue(1, 2, 3)
    _fail_all(queue)
    assert queue.requeue_failed(limit=2) == 2
    assert [item.payload for item in queue.peek("main", 5)] == [1, 2]
    assert [item.payload for item in queue.peek("failed", 5)] == [3]


def test_remove_failed_deletes_all_or_only_those_failed_long_ago(queue, clock):
    queue.enqueue("old")
    _fail_all(queue)
    clock.advance(hours=2)
    queue.enqueue("new", "newer")
    _fail_all(queue)
    queue.enqueue("waiting")
    assert queue.remove_failed(older_than=timedelta(hours=1)) == 1
    assert [item.payload for item in queue.peek("failed", 5)] == ["new", "newer"]
    assert queue.remove_failed(limit=1) == 1
    assert queue.remove_failed() == 1
    assert (queue.length("main"), queue.length("failed")) == (1, 0)


# --- expiry -----------------------------------------------------------------------------------------


def test_handle_expired_requeues_only_items_claimed_longer_ago_and_counts(queue, clock):
    queue.enqueue("old", "young")
    (old,) = queue.claim()
    clock.advance(minutes=4)
    (young,) = queue.claim()
    clock.advance(minutes=2)
    touched = queue.handle_expired(timedelta(minutes=5))
    assert touched == [old]
    assert queue.peek("busy") == [young]
    (back,) = queue.peek("main")
    assert (back.id, back.requeue_count, back.claimed_at) == (old.id, 1, None)
    assert back.last_error == "claim expired (held longer than 300 s)"


def test_handle_expired_defaults_to_the_visibility_timeout(make_queue, clock):
    queue = make_queue(visibility_timeout=timedelta(seconds=30))
    queue.enqueue("a")
    queue.claim()
    clock.advance(seconds=29)
    assert queue.handle_expired() == []
    clock.advance(seconds=2)
    assert len(queue.handle_expired()) == 1


def test_expired_items_past_the_requeue_limit_go_to_failed(make_queue, clock):
    queue = make_queue(requeue_limit=1)
    queue.enqueue("stuck")
    for _ in range(2):
        queue.claim()
        clock.advance(minutes=10)
        queue.handle_expired(timedelta(minutes=5))
    (failed,) = queue.peek("failed")
    assert (failed.payload, failed.requeue_count, failed.fail_count) == ("stuck", 1, 1)


def test_handle_expired_can_fail_them(queue, clock):
    queue.enqueue("a", "b")
    items = queue.claim(2)
    clock.advance(minutes=10)
    assert queue.handle_expired(timedelta(minutes=5), action="fail") == items
    assert [item.payload for item in queue.peek("failed", 5)] == ["a", "b"]
    assert queue.peek("failed")[0].last_error == "claim expired (held longer than 300 s)"


def test_handle_expired_can_drop_them(queue, clock):
    queue.enqueue("a", "b")
    items = queue.claim(2)
    clock.advance(minutes=10)
    assert queue.handle_expired(timedelta(minutes=5), action="drop") == items
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (0, 0, 0)


def test_handle_expired_respects_a_limit_oldest_claim_first(queue, clock):
    queue.enqueue("a", "b", "c")
    for _ in range(3):
        queue.claim()
        clock.advance(seconds=1)
    clock.advance(minutes=10)
    assert [item.payload for item in queue.handle_expired(timedelta(minutes=5), limit=2)] == ["a", "b"]
    assert [item.payload for item in queue.peek("busy")] == ["c"]


def test_handle_expired_refuses_an_unknown_action(queue):
    with pytest.raises(ValueError):
        queue.handle_expired(timedelta(minutes=5), action="explode")


# --- inspection -------------------------------------------------------------------------------------


def test_peek_shows_each_sub_queue_in_its_order_without_claiming(queue, clock):
    queue.enqueue("a", "b", "c", "d")
    a, b = queue.claim(2)
    queue.fail(a, "x")
    assert [item.payload for item in queue.peek("main", 5)] == ["c", "d"]
    assert [item.payload for item in queue.peek("busy", 5)] == ["b"]
    assert [item.payload for item in queue.peek("failed", 5)] == ["a"]
    assert queue.length("main") == 2


def test_age_of_each_sub_queue(queue, clock):
    assert (queue.age("main"), queue.age("busy"), queue.age("failed")) == (None, None, None)
    queue.enqueue("a", "b", "c")
    clock.advance(seconds=10)
    a, b = queue.claim(2)
    clock.advance(seconds=5)
    queue.fail(a, "x")
    clock.advance(seconds=1)
    assert queue.age("main") == timedelta(seconds=16)
    assert queue.age("busy") == timedelta(seconds=6)
    assert queue.age("failed") == timedelta(seconds=1)
    assert queue.stats() == {
        "name": "jobs",
        "backend": queue.backend,
        "main": {"length": 1, "age_s": 16.0},
        "busy": {"length": 1, "age_s": 6.0},
        "failed": {"length": 1, "age_s": 1.0},
    }


def test_each_item_says_since_when_it_is_in_its_sub_queue(queue, clock):
    queue.enqueue("a", "b", "c")
    enqueued = clock.now
    clock.advance(seconds=10)
    a, b = queue.claim(2)
    claimed = clock.now
    clock.advance(seconds=5)
    queue.fail(a, "x")
    (waiting,), (busy,), (failed,) = (queue.peek(kind, 1) for kind in ("main", "busy", "failed"))
    assert waiting.since("main") == enqueued
    assert busy.since("busy") == claimed
    assert failed.since("failed") == clock.now
    assert waiting.since("busy") is None and waiting.since("failed") is None


def test_flush_deletes_every_item_and_ids_are_not_reused(queue):
    queue.enqueue("a", "b", "c", "d")
    a, b = queue.claim(2)
    queue.fail(a, "x")
    assert queue.flush() == 4
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (0, 0, 0)
    assert queue.done(b) == 0
    (pk,) = queue.enqueue("e")
    assert pk > b.id


def test_queues_of_different_names_are_separate(make_queue):
    jobs, mail = make_queue("jobs"), make_queue("mail")
    jobs.enqueue("j")
    mail.enqueue("m1", "m2")
    assert [item.payload for item in mail.claim(5)] == ["m1", "m2"]
    assert [item.payload for item in jobs.claim(5)] == ["j"]


def test_a_queue_name_must_be_safe_for_keys_and_urls(make_queue):
    for bad in ["", "a{b}", "has space", "x" * 65, "slash/"]:
        with pytest.raises(ValueError):
            make_queue(bad)


# --- operator actions on chosen items ---------------------------------------------------------------


def test_requeue_ids_moves_busy_and_failed_items_to_the_tail_with_a_fresh_count(make_queue):
    queue = make_queue(requeue_limit=1)
    queue.enqueue("a", "b", "c")
    queue.requeue(*queue.claim(), error="slow")  # a: requeued once, the limit
    b, c, a = queue.claim(3)
    queue.requeue(a, error="boom")  # past the limit: failed
    queue.done(c)
    queue.enqueue("e")
    assert queue.requeue_ids([b.id, a.id]) == 2
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (3, 0, 0)
    waiting = queue.peek("main", 5)
    assert waiting[0].payload == "e"
    moved = {item.payload: item for item in waiting[1:]}
    assert (moved["a"].requeue_count, moved["a"].fail_count, moved["a"].last_error) == (0, 1, "boom")
    assert (moved["a"].failed_at, moved["a"].claimed_at, moved["a"].claims) == (None, None, 2)
    assert (moved["b"].requeue_count, moved["b"].claimed_at, moved["b"].claims) == (0, None, 1)
    queue.claim(3)
    assert queue.requeue_ids([a.id]) == 1  # fresh count: the limit does not send it to failed


def test_requeue_ids_takes_a_busy_item_from_its_worker(queue, queue_log):
    queue.enqueue("a")
    (item,) = queue.claim()
    assert queue.requeue_ids([item.id]) == 1
    assert queue.done(item) == 0
    (again,) = queue.claim()
    assert (again.id, again.claims) == (item.id, 2)


def test_requeue_ids_leaves_waiting_items_in_place_and_ignores_unknown_and_repeated_ids(queue):
    ids = queue.enqueue("a", "b", "c")
    assert queue.requeue_ids([ids[0], 10**9]) == 0
    assert queue.requeue_ids([]) == 0
    (a,) = queue.claim()
    assert queue.requeue_ids([a.id, a.id]) == 1
    assert [item.payload for item in queue.claim(5)] == ["b", "c", "a"]


def test_drop_ids_deletes_items_from_every_sub_queue(queue):
    queue.enqueue("a", "b", "c", "d", "e")
    a, b = queue.claim(2)
    queue.fail(a, "boom")
    d = queue.peek("main", 2)[1]
    assert queue.drop_ids([a.id, b.id, d.id]) == 3
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (2, 0, 0)
    assert [item.payload for item in queue.peek("main", 5)] == ["c", "e"]
    assert [item.payload for item in queue.claim(5)] == ["c", "e"]


def test_a_claimed_then_dropped_item_cannot_be_finished_or_requeued(queue, queue_log):
    queue.enqueue("a")
    (item,) = queue.claim()
    assert queue.drop_ids([item.id]) == 1
    assert queue.done(item) == 0
    assert queue.done(item.id) == 0
    assert queue.requeue(item) == 0
    assert queue.requeue_ids([item.id]) == 0
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (0, 0, 0)


def test_drop_ids_ignores_unknown_repeated_and_already_dropped_ids(queue):
    ids = queue.enqueue("a", "b")
    assert queue.drop_ids([ids[0], ids[0], 10**9]) == 1
    assert queue.drop_ids([ids[0]]) == 0
    assert queue.drop_ids([]) == 0
    assert [item.payload for item in queue.claim(5)] == ["b"]


def test_dropped_waiting_items_are_not_counted_peeked_or_claimed(queue, clock):
    ids = queue.enqueue(*range(3))
    clock.advance(seconds=10)
    ids += queue.enqueue(*range(3, 8))
    clock.advance(seconds=5)
    assert queue.drop_ids([ids[1], ids[3], ids[4], ids[7]]) == 4
    assert queue.length("main") == 4
    assert [item.payload for item in queue.peek("main", 3)] == [0, 2, 5]
    assert queue.drop_ids([ids[0], ids[2]]) == 2  # the head: what waits now was enqueued later
    assert queue.age("main") == timedelta(seconds=5)
    assert [item.payload for item in queue.claim(1)] == [5]
    assert queue.length("main") == 1
    assert [item.payload for item in queue.claim(5)] == [6]
    assert queue.claim(5) == []
    assert queue.length("main") == 0
    queue.enqueue("x", "y")
    queue.drop_ids([queue.peek("main", 2)[1].id])
    assert queue.flush() == 3  # x, and 5 and 6 in busy
    assert queue.length("main") == 0


def test_requeue_and_drop_of_many_failed_items_keep_the_rest_in_failure_order(queue):
    queue.enqueue(*range(80))
    for item in queue.claim(80):
        queue.fail(item, "boom")
    failed = queue.peek("failed", 80)
    assert queue.requeue_ids([item.id for item in failed[::2]]) == 40
    assert queue.drop_ids([item.id for item in failed[1:71:2]]) == 35
    assert [item.payload for item in queue.peek("failed", 80)] == [71, 73, 75, 77, 79]
    assert queue.length("failed") == 5
    assert [item.payload for item in queue.claim(80)] == list(range(0, 80, 2))


# --- consume ----------------------------------------------------------------------------------------


def test_consume_handles_every_item_in_order_and_returns_when_empty(queue):
    queue.enqueue(*range(7))
    seen = []
    assert queue.consume(lambda item: seen.append(item.payload), chunk=3, return_when_empty=True) == 7
    assert seen == list(range(7))
    assert (queue.length("main"), queue.length("busy")) == (0, 0)


def test_consume_stops_after_max_items(queue):
    queue.enqueue(*range(5))
    seen = []
    assert queue.consume(lambda item: seen.append(item.payload), chunk=2, max_items=3) == 3
    assert seen == [0, 1, 2]
    assert [item.payload for item in queue.peek("main", 5)] == [3, 4]
    assert queue.length("busy") == 0


def test_consume_stops_after_max_seconds_on_an_empty_queue(queue):
    started = time.monotonic()
    assert queue.consume(lambda item: None, max_seconds=0.3) == 0
    assert 0.3 <= time.monotonic() - started < 2


def _boom(item):
    raise RuntimeError(f"cannot handle {item.payload}")


def test_consume_requeues_an_item_whose_callback_raises(queue):
    queue.enqueue("bad")
    assert queue.consume(_boom, max_items=1) == 1
    (item,) = queue.peek("main")
    assert (item.requeue_count, item.last_error) == (1, "RuntimeError: cannot handle bad")


def test_consume_can_fail_an_item_whose_callback_raises(queue):
    queue.enqueue("bad", "good")
    seen = []

    def callback(item):
        if item.payload == "bad":
            _boom(item)
        seen.append(item.payload)

    assert queue.consume(callback, on_error="fail", return_when_empty=True) == 2
    assert seen == ["good"]
    assert queue.peek("failed")[0].last_error == "RuntimeError: cannot handle bad"


def test_consume_can_drop_an_item_whose_callback_raises(queue):
    queue.enqueue("bad")
    assert queue.consume(_boom, on_error="drop", return_when_empty=True) == 1
    assert (queue.length("main"), queue.length("busy"), queue.length("failed")) == (0, 0, 0)


def test_consume_refuses_an_unknown_error_action(queue):
    with pytest.raises(ValueError):
        queue.consume(lambda item: None, on_error="ignore")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_consume_stops_on_a_signal_after_the_item_in_hand(queue, signum):
    queue.enqueue(*range(10))
    seen = []
    previous = signal.getsignal(signum)

    def callback(item):
        seen.append(item.payload)
        if item.payload == 2:
            os.kill(os.getpid(), signum)

    assert queue.consume(callback, chunk=5) == 3
    assert seen == [0, 1, 2]
    assert queue.length("busy") == 0
    assert [item.payload for item in queue.peek("main", 10)] == list(range(3, 10))
    assert [item.requeue_count for item in queue.peek("main", 10)] == [0] * 7
    assert signal.getsignal(signum) is previous


def test_consume_outside_the_main_thread_runs_without_signal_handlers(transactional_db, queue):
    queue.enqueue(1, 2)
    result = []
    worker = threading.Thread(
        target=in_thread(lambda: result.append(queue.consume(lambda item: None, return_when_empty=True)))
    )
    worker.start()
    worker.join(10)
    assert result == [2]
