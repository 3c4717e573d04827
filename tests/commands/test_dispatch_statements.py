"""The dispatch loop's hand-written statements and how its threads share them: starts of several
sends in one conditional UPDATE, outcomes recorded in plain SQL, and a round whose sweep runs
beside its drain."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from ankusa_site.core.stock import stock
from commands.dispatch import adapters, rounds, senders
from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.rounds import run_round
from commands.dispatch.senders import _Starts
from commands.dispatch.sends import WORKER_LOST, Sent, Unstarted, _Entry
from commands.dispatch.statements import (
    BOOKKEEPING_FIELDS,
    failing_or_held,
    finish_in_one,
    finish_sends,
    finish_with_attempts,
    insert_attempts,
    load_for_sending,
    start_sends,
)
from commands.dispatch.sweep import sweep
from commands.lifecycle import QUEUE_NAME
from commands.models import Attempt, Command, Connector
from commands.retry import Outlook
from commands.states import Event, State
from queues.backends import get_queue

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def queue(db):
    q = get_queue(QUEUE_NAME)
    q.flush()
    return q


def states(*commands: Command) -> list[tuple[str, int]]:
    return [
        (c.state, c.attempts) for c in Command.objects.filter(pk__in=[c.pk for c in commands]).order_by("pk")
    ]


def test_start_sends_wins_only_commands_still_queued_at_the_attempt_before(make_connector, make_command):
    connector = make_connector()
    fresh, retried, moved_on, elsewhere = (make_command(connector, state=State.QUEUED) for _ in range(4))
    Command.objects.filter(pk=retried.pk).update(attempts=2)
    Command.objects.filter(pk=moved_on.pk).update(attempts=1)  # another worker started attempt 1
    Command.objects.filter(pk=elsewhere.pk).update(state=State.SUCCEEDED)
    wanted = [(fresh.pk, 1), (retried.pk, 3), (moved_on.pk, 1), (elsewhere.pk, 1)]
    assert start_sends(wanted, T0) == {(fresh.pk, 1), (retried.pk, 3)}
    assert states(fresh, retried, moved_on, elsewhere) == [
        (State.DISPATCHING, 1),
        (State.DISPATCHING, 3),
        (State.QUEUED, 1),
        (State.SUCCEEDED, 0),
    ]
    assert Command.objects.get(pk=fresh.pk).state_changed_at == T0


def test_two_entries_for_one_attempt_in_one_start_win_once(make_connector, make_command):
    command = make_command(make_connector(), state=State.QUEUED)
    assert start_sends([(command.pk, 1), (command.pk, 1), (command.pk, 2)], T0) == {(command.pk, 1)}
    assert states(command) == [(State.DISPATCHING, 1)]


def entry(command: Command, attempt: int = 1) -> _Entry:
    return _Entry(item=None, command=command, attempt=attempt)


def test_starts_asked_at_once_share_statements_and_each_sender_learns_its_own(
    make_connector, make_command, monkeypatch
):
    connector = make_connector()
    commands = [make_command(connector, state=State.QUEUED) for _ in range(12)]
    starts = _Starts()
    asks = [entry(c) for c in commands] + [entry(commands[0])]  # the last one is a duplicate item
    statements = []
    real = start_sends

    def counted(wanted, now):
        statements.append(len(wanted))
        # The first statements wait until every other sender has asked, as they would behind a
        # slow commit, so the asks that come meanwhile have to share the next statements.
        deadline = time.monotonic() + 10
        while len(statements) <= starts.at_once and len(starts.asked) < len(asks) - starts.at_once:
            if time.monotonic() > deadline:
                break
            time.sleep(0.001)
        return real(wanted, now)

    monkeypatch.setattr(senders, "start_sends", counted)
    won: dict[int, bool] = {}

    def ask(number: int) -> None:
        try:
            won[number] = starts.start(asks[number], T0)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(len(asks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starts.close()
    assert sum(statements) == len(asks)
    assert len(statements) <= 2 * starts.at_once
    assert [won[n] for n in range(1, 12)] == [True] * 11
    assert sorted([won[0], won[12]]) == [False, True]  # of the two items for one attempt, one sends
    assert starts.asked == []
    assert Command.objects.filter(state=State.DISPATCHING, attempts=1).count() == 12


def test_a_start_that_fails_says_it_is_unknown_and_the_next_statement_is_made_all_the_same(
    make_connector, make_command, monkeypatch
):
    command = make_command(make_connector(), state=State.QUEUED)

    def broken(wanted, now):
        raise RuntimeError("database went away")

    monkeypatch.setattr(senders, "start_sends", broken)
    starts = _Starts()
    # Not sent: the recorder undoes a start stamped T0, should it have committed unseen.
    assert starts.start(entry(command), T0) == Unstarted(T0)
    monkeypatch.undo()
    assert starts.start(entry(command), T0) is True
    starts.close()
    assert states(command) == [(State.DISPATCHING, 1)]
    assert starts.start(entry(command), T0) == Unstarted()  # closed: not asked, not sent


def test_finish_sends_moves_only_commands_dispatching_that_attempt(make_connector, make_command):
    connector = make_connector()
    current, recovered = (make_command(connector, state=State.DISPATCHING, attempts=2) for _ in range(2))
    Command.objects.filter(pk=recovered.pk).update(state=State.FAILED)
    changes = {"last_outlook": Outlook.AGAIN, "last_error": "HTTP 503", "skip_decided_at": T0}
    assert finish_sends([current.pk, recovered.pk], 2, Event.FAIL, T0, changes) == 1
    assert finish_sends([current.pk], 2, Event.FAIL, T0, changes) == 0
    row = Command.objects.get(pk=current.pk)
    assert (row.state, row.last_outlook, row.last_error, row.skip_decided_at, row.state_changed_at) == (
        State.FAILED,
        Outlook.AGAIN,
        "HTTP 503",
        T0,
        T0,
    )


def test_a_group_writes_its_attempt_rows_only_if_every_command_moved(make_connector, make_command):
    connector = make_connector()
    current, recovered, other = (
        make_command(connector, state=State.DISPATCHING, attempts=1) for _ in range(3)
    )
    # recover() took it for lost: failed, with its attempt row (a second row for attempt 1 would
    # break the unique number).
    Command.objects.filter(pk=recovered.pk).update(state=State.FAILED, last_error_class=WORKER_LOST)
    Attempt.objects.create(command=recovered, number=1, started_at=T0, ok=False, error_class=WORKER_LOST)
    done = adapters.Outcome(ok=True, status=200)

    def sends(*commands: Command) -> list[Sent]:
        return [Sent(command, 1, T0, T0 + timedelta(seconds=1), done) for command in commands]

    changes = {"last_outlook": "", "last_error": ""}
    in_one = connection.vendor == "postgresql" and not stock("sql")  # as the recorder writes there

    def finish(group: list[Sent]) -> int:
        if in_one:
            (moved,), _, _ = finish_in_one([(group, 1, Event.SUCCEED, changes)], T0, [], None, [])
            return moved
        return finish_with_attempts(group, 1, Event.SUCCEED, T0, changes)

    with CaptureQueriesContext(connection) as captured:
        assert finish(sends(current)) == 1
    if in_one:
        assert len(captured) == 1  # the move and its attempt row: one round trip
    assert finish(sends(other, recovered)) == 1
    # The recorder then redoes that batch row by row; this statement wrote no row for it. On
    # PostgreSQL the one that moved has its row, in the transaction the recorder rolls back.
    assert list(Attempt.objects.filter(command=recovered).values_list("error_class", flat=True)) == [
        WORKER_LOST
    ]
    assert Attempt.objects.filter(command=current).count() == 1
    assert states(current, recovered) == [(State.SUCCEEDED, 1), (State.FAILED, 1)]


def test_failing_or_held_names_only_the_asked_connectors_counting_a_run_or_held(make_connector):
    calm, failing, held, held_and_failing, not_asked = (make_connector(f"c{i}") for i in range(5))
    Connector.objects.filter(pk__in=[failing.pk, held_and_failing.pk, not_asked.pk]).update(outage_failures=3)
    Connector.objects.filter(pk__in=[held.pk, held_and_failing.pk]).update(held_since=T0)
    asked = [calm.pk, failing.pk, held.pk, held_and_failing.pk]
    assert sorted(failing_or_held(asked)) == [failing.pk, held.pk, held_and_failing.pk]
    assert failing_or_held([calm.pk]) == []


def test_commands_loaded_for_sending_carry_their_payload_and_load_the_rest_on_demand(
    make_connector, make_command
):
    connector = make_connector()
    command = make_command(connector, state=State.QUEUED, payload={"order": 7, "lines": [1, 2]})
    loaded = load_for_sending([command.pk, command.pk + 1000])
    assert list(loaded) == [command.pk]
    got = loaded[command.pk]
    assert (got.payload, got.connector_id, got.state) == (
        {"order": 7, "lines": [1, 2]},
        connector.pk,
        State.QUEUED,
    )
    assert got.get_deferred_fields() == set(BOOKKEEPING_FIELDS)
    assert got.created_at == command.created_at  # a deferred field, read when asked for


def test_commands_loaded_for_sending_equal_what_the_orm_loads_field_by_field(make_connector, make_command):
    connector = make_connector()
    ids = [
        make_command(connector, state=State.QUEUED, payload={"n": 1.5, "s": "é", "l": [None, True]}).pk,
        make_command(connector, state=State.DISPATCHING, attempts=2, next_attempt_at=T0).pk,
    ]
    loaded = load_for_sending(ids)
    expected = Command.objects.defer(*BOOKKEEPING_FIELDS).in_bulk(ids)
    fields = [f.attname for f in Command._meta.concrete_fields if f.name not in BOOKKEEPING_FIELDS]
    for pk in ids:
        got = [(name, getattr(loaded[pk], name), type(getattr(loaded[pk], name))) for name in fields]
        want = [(name, getattr(expected[pk], name), type(getattr(expected[pk], name))) for name in fields]
        assert got == want


def test_commands_loaded_for_sending_bring_their_connector_in_the_same_query(
    make_connector, make_command, django_assert_num_queries
):
    one, other = make_connector("one"), make_connector("other")
    ids = [make_command(one).pk, make_command(one).pk, make_command(other).pk]
    with django_assert_num_queries(1):
        loaded = load_for_sending(ids)
        connectors = [loaded[pk].connector for pk in ids]
    assert connectors[0] is connectors[1]  # one instance per connector
    expected = Connector.objects.in_bulk([one.pk, other.pk])
    fields = [f.attname for f in Connector._meta.concrete_fields]
    for got in connectors:
        want = expected[got.pk]
        assert [(name, getattr(got, name)) for name in fields] == [
            (name, getattr(want, name)) for name in fields
        ]


def test_insert_attempts_writes_complete_rows_and_the_model_defaults(make_connector, make_command):
    connector = make_connector()
    ok, failed = make_command(connector), make_command(connector)
    finished = T0 + timedelta(milliseconds=1500)
    insert_attempts(
        [
            Sent(ok, 1, T0, finished, adapters.Outcome(ok=True, status=200, excerpt='{"é": "\\"x\\""}')),
            Sent(
                failed,
                3,
                T0,
                finished,
                adapters.Outcome(
                    ok=False, outlook=Outlook.NEVER, status=404, detail="HTTP 404", error_class="HTTPStatus"
                ),
            ),
        ]
    )
    rows = Attempt.objects.order_by("command_id").values(
        "command_id", "number", "started_at", "finished_at", "ok", "outlook", "status_code", "error_class",
        "error_message", "response_excerpt", "manual", "manual_by",
    )  # fmt: skip
    assert list(rows) == [
        {
            "command_id": ok.pk, "number": 1, "started_at": T0, "finished_at": finished, "ok": True,
            "outlook": "", "status_code": 200, "error_class": "", "error_message": "",
            "response_excerpt": '{"é": "\\"x\\""}', "manual": False, "manual_by": None,
        },
        {
            "command_id": failed.pk, "number": 3, "started_at": T0, "finished_at": finished, "ok": False,
            "outlook": Outlook.NEVER, "status_code": 404, "error_class": "HTTPStatus",
            "error_message": "HTTP 404", "response_excerpt": "", "manual": False, "manual_by": None,
        },
    ]  # fmt: skip


def test_a_drain_fed_by_a_sweep_waits_for_items_queued_after_it_began(
    make_connector, make_command, queue, sink
):
    connector = make_connector(url=sink.url)
    fed = threading.Event()
    with Dispatcher(concurrency=2, per_connector=2, queue=queue) as dispatcher:
        result = []
        drainer = threading.Thread(
            target=lambda: (result.append(dispatcher.drain(fed_until=fed)), connections.close_all())
        )
        drainer.start()
        drainer.join(0.3)
        assert drainer.is_alive()  # an empty queue does not end it while it is fed
        commands = [make_command(connector) for _ in range(3)]
        sweep(queue=queue)
        fed.set()
        drainer.join(30)
    assert result[0].results == {"succeeded": 3}
    assert sink.counts == {str(c.pk): 1 for c in commands}


def test_a_round_whose_sweep_fails_raises_after_its_drain(make_connector, make_command, queue, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("sweep broke")

    monkeypatch.setattr(rounds, "sweep", broken)
    with Dispatcher(concurrency=2, per_connector=2, queue=queue) as dispatcher:
        with pytest.raises(RuntimeError, match="sweep broke"):
            run_round(dispatcher)


def test_an_empty_claim_loads_nothing_and_asks_the_database_nothing(django_assert_num_queries):
    # Under steady load a drain claims every 10 ms, and many of those claims come back empty.
    with django_assert_num_queries(0):
        assert load_for_sending([]) == {}
