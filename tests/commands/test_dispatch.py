"""The dispatch loop in one process: sweep, consume, recover, and the seed's schedules on a moved clock."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connections
from django.utils import timezone

from commands.dispatch import recovery
from commands.dispatch.dispatcher import Dispatcher, DrainSummary
from commands.dispatch.recovery import recover, recovery_line
from commands.dispatch.rounds import RoundSummary, run_round
from commands.dispatch.sends import WORKER_LOST
from commands.dispatch.sweep import sweep
from commands.lifecycle import QUEUE_NAME, item_payload
from commands.models import Attempt, Command
from commands.retry import Outlook, SkipReason
from commands.states import Event, State
from queues.backends import get_queue
from tests.commands.sink import Gate, script

# Sends run in worker threads with their own connections: they must see committed rows.
pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)
VISIBILITY = timedelta(seconds=settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S)


@pytest.fixture
def queue(db):
    q = get_queue(QUEUE_NAME)
    q.flush()
    return q


@pytest.fixture
def clock():
    with time_machine.travel(T0, tick=False) as traveller:
        yield traveller


@pytest.fixture
def dispatcher(queue):
    with Dispatcher(concurrency=4, per_connector=4, queue=queue) as running:
        yield running


def round_at(dispatcher, clock, when: datetime) -> RoundSummary:
    clock.move_to(when)
    return run_round(dispatcher)


def test_sweep_queues_an_approved_command_for_its_first_attempt(make_connector, make_command, queue, clock):
    command = make_command(make_connector(kind="log"))
    summary = sweep()
    assert (summary.taken, summary.skipped) == (1, {})
    command.refresh_from_db()
    assert (command.state, command.attempts, command.next_attempt_at) == (
        State.QUEUED,
        0,
        T0 + timedelta(seconds=30),
    )
    assert [item.payload for item in queue.peek("main", 10)] == [{"command": command.pk, "attempt": 1}]


def test_sweep_writes_the_skip_reason_and_leaves_the_command_where_it_is(
    make_connector, make_command, queue, clock
):
    command = make_command(make_connector(), state=State.FAILED, attempts=1, last_outlook=Outlook.AGAIN)
    assert sweep().skipped == {SkipReason.NOT_IDEMPOTENT: 1}
    command.refresh_from_db()
    assert (command.state, command.skip_reason, command.skip_decided_at) == (
        State.FAILED,
        "not-idempotent",
        T0,
    )
    assert queue.length("main") == 0
    # Parked: the next sweep does not even look at it.
    assert sweep().skipped == {}


def test_a_round_sends_an_approved_command_and_records_the_attempt(
    make_connector, make_command, dispatcher, clock, sink
):
    command = make_command(make_connector(url=sink.url), {"order": "A-1"})
    summary = run_round(dispatcher)
    assert (summary.swept.taken, summary.drained.claimed, summary.drained.results) == (1, 1, {"succeeded": 1})
    command.refresh_from_db()
    assert (command.state, command.attempts, command.next_attempt_at, command.skip_reason) == (
        State.SUCCEEDED,
        1,
        None,
        "",
    )
    [attempt] = Attempt.objects.all()
    assert (attempt.number, attempt.started_at, attempt.finished_at, attempt.ok, attempt.status_code) == (
        1,
        T0,
        T0,
        True,
        200,
    )
    assert sink.counts == {str(command.pk): 1}
    assert dispatcher.queue.length("main") == dispatcher.queue.length("busy") == 0
    assert "took 1, skipped none; claimed 1: 1 succeeded;" in summary.line()


def test_503_twice_then_200_succeeds_on_attempt_3_after_30s_and_2min(
    make_connector, make_command, dispatcher, clock, sink
):
    sink.respond = script(503, 503, 200)
    command = make_command(make_connector(url=sink.url, idempotent=True))
    round_at(dispatcher, clock, T0)
    command.refresh_from_db()
    assert (command.state, command.last_outlook, command.skip_reason) == (
        State.FAILED,
        "again",
        "backing-off",
    )
    round_at(dispatcher, clock, T0 + timedelta(seconds=29))
    assert sink.counts[str(command.pk)] == 1
    round_at(dispatcher, clock, T0 + timedelta(seconds=30))
    round_at(dispatcher, clock, T0 + timedelta(seconds=30 + 119))
    assert sink.counts[str(command.pk)] == 2
    round_at(dispatcher, clock, T0 + timedelta(seconds=30 + 120))
    command.refresh_from_db()
    assert (command.state, command.attempts) == (State.SUCCEEDED, 3)
    starts = list(Attempt.objects.order_by("number").values_list("started_at", flat=True))
    assert [b - a for a, b in zip(starts, starts[1:], strict=False)] == [
        timedelta(seconds=30),
        timedelta(minutes=2),
    ]
    assert list(Attempt.objects.order_by("number").values_list("ok", "status_code", "outlook")) == [
        (False, 503, "again"),
        (False, 503, "again"),
        (True, 200, ""),
    ]


def test_503_three_times_is_attempts_spent_with_no_fourth_attempt(
    make_connector, make_command, dispatcher, clock, sink
):
    sink.respond = script(503)
    command = make_command(make_connector(url=sink.url, idempotent=True))
    for at in (T0, T0 + timedelta(seconds=30), T0 + timedelta(seconds=150)):
        round_at(dispatcher, clock, at)
    summary = round_at(dispatcher, clock, T0 + timedelta(seconds=150) + timedelta(minutes=10))
    assert summary.swept.skipped == {SkipReason.ATTEMPTS_SPENT: 1}
    for hours in (1, 24):
        round_at(dispatcher, clock, T0 + timedelta(hours=hours))
    command.refresh_from_db()
    assert (command.state, command.attempts, command.skip_reason) == (State.FAILED, 3, "attempts-spent")
    assert sink.counts[str(command.pk)] == 3


def test_401_is_after_fix_rechecked_every_10_minutes_without_end_and_sent_once_fixed(
    make_connector, make_command, dispatcher, clock, sink
):
    sink.respond = lambda request, nth: (
        200 if request.headers.get("Authorization") == "Bearer good" else 401,
        {},
    )
    connector = make_connector(
        url=sink.url, idempotent=True, secret_header="Authorization", secret="Bearer bad"
    )
    command = make_command(connector)
    round_at(dispatcher, clock, T0)
    round_at(dispatcher, clock, T0 + timedelta(seconds=30))  # the first attempt's backoff
    at = T0 + timedelta(seconds=30)
    for _ in range(12):  # two hours of re-checks, one every 10 minutes, never capped
        round_at(dispatcher, clock, at + timedelta(minutes=10) - timedelta(seconds=1))
        at += timedelta(minutes=10)
        round_at(dispatcher, clock, at)
    command.refresh_from_db()
    assert (command.state, command.last_outlook, command.skip_reason) == (
        State.FAILED,
        "after-fix",
        "backing-off",
    )
    assert command.attempts == sink.counts[str(command.pk)] == 14
    starts = list(Attempt.objects.order_by("number").values_list("started_at", flat=True))
    assert {b - a for a, b in zip(starts[1:], starts[2:], strict=False)} == {timedelta(minutes=10)}

    clock.move_to(at + timedelta(minutes=1))
    connector.secret = "Bearer good"
    connector.save()
    round_at(dispatcher, clock, at + timedelta(minutes=1))  # the very next round, not 10 minutes later
    command.refresh_from_db()
    assert (command.state, command.attempts) == (State.SUCCEEDED, 15)


def test_401_on_a_non_idempotent_connector_stays_failed_until_a_person_acts(
    make_connector, make_command, dispatcher, clock, sink
):
    sink.respond = script(401)
    connector = make_connector(url=sink.url, secret_header="Authorization", secret="Bearer bad")
    command = make_command(connector)
    round_at(dispatcher, clock, T0)
    command.refresh_from_db()
    assert (command.state, command.last_outlook, command.skip_reason) == (
        State.FAILED,
        "after-fix",
        "not-idempotent",
    )
    connector.secret = "Bearer good"
    connector.save()
    for minutes in (0, 10, 60):
        round_at(dispatcher, clock, T0 + timedelta(minutes=minutes, seconds=1))
    command.refresh_from_db()
    assert (command.state, command.skip_reason, command.attempts) == (State.FAILED, "not-idempotent", 1)
    assert sink.counts[str(command.pk)] == 1


def test_a_configuration_problem_is_after_fix_without_sending(
    make_connector, make_command, dispatcher, clock, sink
):
    command = make_command(make_connector(url="", idempotent=True))
    run_round(dispatcher)
    command.refresh_from_db()
    assert (command.state, command.last_outlook, command.last_error_class, command.last_error) == (
        State.FAILED,
        "after-fix",
        "Configuration",
        "no URL",
    )
    assert sink.received == []


def test_a_400_is_never_and_parked(make_connector, make_command, dispatcher, clock, sink):
    sink.respond = script(400)
    command = make_command(make_connector(url=sink.url, idempotent=True))
    round_at(dispatcher, clock, T0)
    round_at(dispatcher, clock, T0 + timedelta(hours=1))
    command.refresh_from_db()
    assert (command.state, command.skip_reason, command.attempts) == (State.FAILED, "never", 1)


def test_a_command_whose_worker_died_mid_send_is_failed_with_no_outlook_and_never_resent(
    make_connector, make_command, dispatcher, clock, sink
):
    command = make_command(make_connector(url=sink.url, idempotent=True), state=State.QUEUED, attempts=0)
    # The start of a send, as a worker that died during it leaves it:
    Command.objects.filter(pk=command.pk).transition(State.QUEUED, Event.START, timezone.now(), attempts=1)
    assert recover().worker_lost == 0  # not yet past the visibility timeout
    clock.move_to(T0 + VISIBILITY + timedelta(seconds=1))
    assert recover().worker_lost == 1
    command.refresh_from_db()
    assert (command.state, command.last_outlook, command.skip_reason, command.last_error_class) == (
        State.FAILED,
        "",
        "outlook-unknown",
        "WorkerLost",
    )
    attempt = Attempt.objects.get()
    assert (attempt.number, attempt.ok, attempt.started_at, attempt.finished_at, attempt.error_class) == (
        1,
        None,
        T0,
        T0 + VISIBILITY + timedelta(seconds=1),
        "WorkerLost",
    )
    round_at(dispatcher, clock, T0 + timedelta(days=1))
    assert sink.received == []


def test_a_queued_command_that_lost_its_item_is_enqueued_again_and_sent_once(
    make_connector, make_command, dispatcher, clock, sink
):
    command = make_command(make_connector(url=sink.url), state=State.QUEUED, state_changed_at=T0)
    assert recover().lost_requeued == 0  # it may still be on its way to the queue
    clock.move_to(T0 + VISIBILITY + timedelta(seconds=1))
    assert recover().lost_requeued == 1
    assert recover().lost_requeued == 0  # once, not every round
    dispatcher.drain()
    command.refresh_from_db()
    assert (command.state, command.attempts) == (State.SUCCEEDED, 1)
    assert sink.counts == {str(command.pk): 1}


def test_a_queued_command_is_lost_only_when_every_item_still_waiting_came_after_it(
    make_connector, make_command, queue, clock
):
    make_command(make_connector(kind="log"), state=State.QUEUED, state_changed_at=T0)
    clock.move_to(T0 - timedelta(seconds=10))
    queue.enqueue({"command": 0, "attempt": 1})  # older than the command: its item may wait behind it
    clock.move_to(T0 + VISIBILITY * 2)
    assert recover().lost_requeued == 0
    queue.done(*queue.claim(1))
    assert recover().lost_requeued == 1


def test_recovery_settles_a_backlog_in_batches_and_stops_at_its_bound(
    make_connector, make_command, queue, clock
):
    connector = make_connector(kind="log", idempotent=True)
    lost_sends = [make_command(connector, state=State.DISPATCHING, attempts=1) for _ in range(5)]
    stranded = [make_command(connector, state=State.QUEUED, state_changed_at=T0) for _ in range(5)]
    clock.move_to(T0 + VISIBILITY + timedelta(seconds=1))
    asked = []

    def until() -> bool:  # the bound is reached after three batches
        asked.append(1)
        return len(asked) > 3

    summary = recover(queue=queue, until=until, batch=2)
    assert (summary.worker_lost, summary.items_requeued, summary.lost_requeued, summary.complete) == (
        5,
        0,
        0,
        False,
    )
    assert "stopped at its bound" in recovery_line(summary)
    assert Attempt.objects.filter(error_class=WORKER_LOST).count() == 5
    summary = recover(queue=queue, batch=2)
    assert (summary.worker_lost, summary.lost_requeued, summary.complete) == (0, 5, True)
    assert sorted(item.payload["command"] for item in queue.peek("main", 10)) == [c.pk for c in stranded]
    assert set(Command.objects.filter(pk__in=[c.pk for c in lost_sends]).values_list("state", flat=True)) == {
        State.FAILED
    }


def test_a_round_recovers_no_further_than_its_max_seconds(
    make_connector, make_command, queue, clock, monkeypatch
):
    connector = make_connector(kind="log")
    for _ in range(3):
        make_command(connector, state=State.QUEUED, state_changed_at=T0)
    clock.move_to(T0 + VISIBILITY + timedelta(seconds=1))
    ticks = iter(range(0, 1000, 10))  # the round's clock: ten seconds pass between two looks at it
    monkeypatch.setattr(recovery, "RECOVER_BATCH", 1)
    with Dispatcher(concurrency=1, queue=queue) as dispatcher:
        monkeypatch.setattr(Dispatcher, "drain", lambda self, **options: DrainSummary())
        # Looked at before each batch: lost sends (10 s), expired items (20 s), lost items (30, 40,
        # 50 s): the bound of 45 s stops it after two of the three.
        summary = run_round(dispatcher, max_seconds=45, clock=lambda: next(ticks))
    assert (summary.recovered.lost_requeued, summary.recovered.complete) == (2, False)
    assert queue.length("main") == 2


def test_duplicate_and_stale_items_send_a_command_once(make_connector, make_command, dispatcher, clock, sink):
    command = make_command(make_connector(url=sink.url))
    sweep()
    dispatcher.queue.enqueue(item_payload(command.pk, 1), item_payload(command.pk, 1))
    dispatcher.queue.enqueue({"command": 10**9, "attempt": 1}, {"bogus": True})
    summary = dispatcher.drain()
    assert summary.results == {"succeeded": 1, "stale": 2}
    assert sink.counts == {str(command.pk): 1}
    assert dispatcher.queue.length("main") == dispatcher.queue.length("busy") == 0
    assert [item.payload for item in dispatcher.queue.peek("failed", 5)] == [{"bogus": True}]


def test_an_answer_holding_what_the_database_cannot_store_is_recorded_with_it_replaced(
    make_connector, make_command, dispatcher, clock, sink
):
    # A NUL in the answer used to fail every write of the outcome: never recorded, never retried.
    sink.respond = lambda request, nth: (503, {}, b'{"error": "down\x00"}')
    command = make_command(make_connector(url=sink.url))
    sweep()
    assert dispatcher.drain().results == {"failed": 1}
    [attempt] = Attempt.objects.filter(command=command)
    assert attempt.response_excerpt == '{"error": "down\ufffd"}'
    assert Command.objects.get(pk=command.pk).state == State.FAILED


def test_sends_run_concurrently_but_never_more_than_the_cap_per_connector(
    make_connector, make_command, queue, sink
):
    sink.delay = 0.05
    slow, other = make_connector(url=sink.url), make_connector("other", url=sink.url)
    for _ in range(12):
        make_command(slow)
    sweep()
    with Dispatcher(concurrency=8, per_connector=3, queue=queue) as dispatcher:
        dispatcher.drain()
    assert sink.max_in_flight == 3
    for _ in range(12):
        make_command(slow)
        make_command(other)
    sink.max_in_flight = 0
    sweep()
    with Dispatcher(concurrency=8, per_connector=3, queue=queue) as dispatcher:
        dispatcher.drain()
    assert sink.max_in_flight == 6
    assert Command.objects.filter(state=State.SUCCEEDED).count() == 36


def test_a_command_is_started_only_when_a_sender_thread_is_free_for_it(
    make_connector, make_command, queue, sink
):
    started_not_received = []

    def respond(request, nth):
        dispatching = {
            str(pk) for pk in Command.objects.filter(state=State.DISPATCHING).values_list("pk", flat=True)
        }
        started_not_received.append(len(dispatching - set(sink.counts)))
        connections.close_all()
        return 200, {}

    sink.respond, sink.delay = respond, 0.02
    for n in range(4):
        connector = make_connector(f"c{n}", url=sink.url)
        for _ in range(4):
            make_command(connector)
    sweep()
    with Dispatcher(concurrency=3, per_connector=3, queue=queue) as dispatcher:
        assert dispatcher.drain().results == {"succeeded": 16}
    # Besides the request in hand, at most the two other threads' requests are on their way.
    assert max(started_not_received) <= 2


def test_a_stop_finishes_the_sends_in_flight_and_puts_the_rest_back(
    make_connector, make_command, queue, sink
):
    sink.delay = 0.2
    connector = make_connector(url=sink.url)
    for _ in range(10):
        make_command(connector)
    sweep()
    with Dispatcher(concurrency=4, per_connector=2, queue=queue) as dispatcher:
        sink.respond = lambda request, nth: (dispatcher.stop.set(), (200, {}))[1]
        summary = dispatcher.drain()
    assert summary.results == {"succeeded": 2, "unstarted": 8}
    assert Command.objects.filter(state=State.SUCCEEDED).count() == 2
    assert Command.objects.filter(state=State.QUEUED).count() == 8
    assert (queue.length("main"), queue.length("busy")) == (8, 0)


def test_two_dispatchers_in_threads_send_every_command_once(make_connector, make_command, queue, sink):
    connectors = [make_connector(f"c{n}", url=sink.url) for n in range(3)]
    commands = [make_command(connectors[n % 3]) for n in range(60)]
    sweep()
    dispatchers = [Dispatcher(concurrency=4, per_connector=2, batch=5, queue=queue) for _ in range(2)]

    def drain(dispatcher):
        try:
            dispatcher.drain()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drain, args=(d,)) for d in dispatchers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for d in dispatchers:
        d.close()
    assert sink.counts == {str(c.pk): 1 for c in commands}
    assert Command.objects.filter(state=State.SUCCEEDED).count() == 60


def test_a_round_on_the_redis_queue_sends_after_commit_and_recovers_lost_items(
    make_connector, make_command, django_redis, clock, sink
):
    queue = get_queue(QUEUE_NAME, backend="redis")
    queue.flush()
    connector = make_connector(url=sink.url)
    commands = [make_command(connector) for _ in range(3)]
    with Dispatcher(concurrency=2, per_connector=2, queue=queue) as dispatcher:
        summary = run_round(dispatcher)
        assert (summary.swept.taken, summary.drained.results) == (3, {"succeeded": 3})
        assert sink.counts == {str(c.pk): 1 for c in commands}
        assert (queue.length("main"), queue.length("busy")) == (0, 0)
        # A command queued whose enqueue never happened (the process died after the commit):
        lost = make_command(connector, state=State.QUEUED, state_changed_at=T0)
        clock.move_to(T0 + VISIBILITY + timedelta(seconds=1))
        summary = run_round(dispatcher)
    assert summary.recovered.lost_requeued == 1
    lost.refresh_from_db()
    assert (lost.state, sink.counts[str(lost.pk)]) == (State.SUCCEEDED, 1)


def test_sends_in_flight_hold_no_database_connection_each(make_connector, make_command, queue, sink):
    from django.db.backends.signals import connection_created

    # Every answer held until all 32 sends are in at once (at most 30 s): no answer's delay to
    # outlast the starts (0.5 s still saw 31 at once in a slow hour's suite run).
    sink.respond = gate = Gate()

    def open_once_all_are_in() -> None:
        deadline = time.monotonic() + 30
        while sink.in_flight < 32 and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.open.set()

    threading.Thread(target=open_once_all_are_in, daemon=True).start()
    for n in range(4):
        connector = make_connector(f"c{n}", url=sink.url, max_in_flight=8)
        for _ in range(8):
            make_command(connector)
    sweep()
    connections.close_all()
    opened: list[str] = []

    def count(sender, connection, **kwargs):
        opened.append(threading.current_thread().name)

    connection_created.connect(count)
    try:
        with Dispatcher(concurrency=32, per_connector=1, queue=queue) as dispatcher:
            assert dispatcher.drain().results == {"succeeded": 32}
    finally:
        connection_created.disconnect(count)
    assert sink.max_in_flight == 32
    # The dispatcher's own thread (claims), one that starts sends, one that records their outcomes.
    assert sorted(opened) == sorted([threading.current_thread().name, "start-0", "record"])
