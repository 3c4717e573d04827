"""The transactional side of the queue contract, on every backend: ``enqueue_on_commit`` (and
``on_commit`` for any write) makes items exist once the caller's transaction commits and never if
it rolls back. A backend that joins the transaction (``joins_transaction``: the database queue on
the caller's connection) writes them inside it, atomically with the caller's rows; one that cannot
(Redis) writes them after the commit. ``enqueue_in_statement`` is the database queue's fast path
on PostgreSQL, and None wherever it cannot be taken; ``done_in_statement`` the same for finishing
claimed items."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group
from django.db import connection, transaction
from django.test import override_settings

from ankusa_site.core.stock import stock
from queues.backends.database import DatabaseFIFO

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def test_every_backend_declares_whether_it_joins_the_callers_transaction(queue, backend):
    assert queue.joins_transaction() is (backend == "database")
    assert queue.joins_transaction("elsewhere") is False  # another connection's transaction: never


def test_enqueue_on_commit_items_exist_once_the_transaction_commits(queue):
    with transaction.atomic():
        Group.objects.create(name="rows of the caller")
        queue.enqueue_on_commit({"n": 1}, {"n": 2})
        # Inside: a joining queue's items are written (visible to this transaction only); the
        # other's are not written yet.
        assert queue.length() == (2 if queue.joins_transaction() else 0)
    assert [item.payload for item in queue.claim(5)] == [{"n": 1}, {"n": 2}]


def test_enqueue_on_commit_leaves_nothing_when_the_transaction_rolls_back(queue):
    with pytest.raises(Boom), transaction.atomic():
        Group.objects.create(name="rows of the caller")
        queue.enqueue_on_commit({"n": 1})
        raise Boom
    assert queue.length() == 0
    assert not Group.objects.filter(name="rows of the caller").exists()


def test_enqueue_on_commit_outside_a_transaction_writes_at_once(queue):
    queue.enqueue_on_commit({"n": 1})
    assert queue.length() == 1


def test_enqueue_on_commit_of_nothing_writes_nothing(queue):
    with transaction.atomic():
        queue.enqueue_on_commit()
    assert queue.length() == 0


def test_any_write_can_follow_the_transaction(queue):
    queue.enqueue({"n": 1})
    [item] = queue.claim()
    with pytest.raises(Boom), transaction.atomic():
        queue.on_commit(lambda: queue.done(item))
        raise Boom
    assert queue.length("busy") == 1  # rolled back: not done
    with transaction.atomic():
        queue.on_commit(lambda: queue.done(item))
    assert queue.length("busy") == 0


def test_a_queue_that_cannot_join_writes_after_the_commit_so_its_failure_leaves_the_rows(make_queue, backend):
    """What the caller must be ready for when the queue does not join: the rows commit, the write
    after them fails (here: the queue refuses the payload at write time), and the rows stay
    without items until the caller's own recovery queues them again."""
    if backend == "database":
        pytest.skip("the database queue joins the transaction: rows and items commit together")
    queue = make_queue()
    broken = make_queue()
    broken.enqueue = lambda *payloads: (_ for _ in ()).throw(ConnectionError("Redis is away"))
    with pytest.raises(ConnectionError), transaction.atomic():
        Group.objects.create(name="committed alone")
        broken.enqueue_on_commit({"n": 1})
    assert Group.objects.filter(name="committed alone").exists()
    assert queue.length() == 0


def test_a_joining_queue_rolls_back_with_the_rows_when_the_commit_fails(make_queue, backend):
    if backend != "database":
        pytest.skip("only a joining queue writes inside the transaction")
    queue = make_queue()
    Group.objects.create(name="taken")
    with pytest.raises(Exception, match="(?i)unique"), transaction.atomic():
        queue.enqueue_on_commit({"n": 1})
        Group.objects.create(name="taken")  # the caller's write fails after the enqueue
    assert queue.length() == 0


def test_enqueue_in_statement_writes_items_from_the_callers_rows_on_postgresql(queue, backend):
    sql = queue.enqueue_in_statement("(VALUES (2), (1)) AS v(n)", "jsonb_build_object('n', n)", "n")
    if backend != "database" or connection.vendor != "postgresql" or stock("sql"):
        assert sql is None  # another store, no hand-written SQL for this vendor, or stock mode
        return
    statement, params = sql
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
    assert [item.payload for item in queue.claim(5)] == [{"n": 1}, {"n": 2}]


def test_enqueue_in_statement_is_not_offered_on_another_connection_or_under_stock_sql(make_queue, backend):
    if backend != "database":
        pytest.skip("database queue only")
    queue = make_queue()
    assert queue.enqueue_in_statement("t", "p", "o", using="elsewhere") is None
    with override_settings(ANKUSA_STOCK_DJANGO=frozenset({"sql"})):
        assert queue.enqueue_in_statement("t", "p", "o") is None


def test_database_queue_on_another_connection_waits_for_the_commit():
    queue = DatabaseFIFO("jobs", using="default")
    assert queue.joins_transaction("default")
    assert not queue.joins_transaction("other")


def test_done_in_statement_finishes_the_items_still_held_from_the_callers_statement(queue, backend, caplog):
    queue.enqueue({"n": 1}, {"n": 2})
    held, lost = queue.claim(2)
    queue.requeue(lost)  # its claim ended (as recovery's would): done must skip it
    done = queue.done_in_statement(held, lost)
    if backend != "database" or connection.vendor != "postgresql" or stock("sql"):
        assert done is None  # another store, no hand-written SQL for this vendor, or stock mode
        return
    statement, params, finished = done
    with connection.cursor() as cursor:
        cursor.execute(f"WITH finished AS ({statement}) SELECT ARRAY(SELECT id FROM finished)", params)
        (ids,) = cursor.fetchone()
    assert ids == [held.id]
    assert finished(ids) == 1
    assert "queue_claim_lost" in caplog.text  # as done() reports an item it no longer held
    assert (queue.length("busy"), [item.payload for item in queue.claim(5)]) == (0, [{"n": 2}])


def test_done_in_statement_is_not_offered_on_another_connection_under_stock_sql_or_for_a_bare_id(
    make_queue, backend
):
    if backend != "database":
        pytest.skip("database queue only")
    queue = make_queue()
    queue.enqueue({"n": 1})
    (item,) = queue.claim(1)
    assert queue.done_in_statement(item, using="elsewhere") is None
    assert queue.done_in_statement(item.id) is None  # type: ignore[arg-type]  # no claim to check
    with override_settings(ANKUSA_STOCK_DJANGO=frozenset({"sql"})):
        assert queue.done_in_statement(item) is None
