"""A send's outcome is kept until it is written: the recorder tries again while the database
refuses it, spools it to disk when its process must exit, and the spool is written back — winning
over a recovery that took the send for lost meanwhile. Recovery runs on a timer of its own."""

from __future__ import annotations

import json
import stat
import threading
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from ankusa_site.core.stock import stock
from commands.dispatch import adapters, rounds, senders, spool
from commands.dispatch import recorder as recording  # where the recorder looks its writes up
from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.outcomes import record_outcomes
from commands.dispatch.recorder import _Recorder, replay_spool
from commands.dispatch.recovery import RecoverSummary, recover
from commands.dispatch.rounds import keep_recovering
from commands.dispatch.sends import WORKER_LOST, Sent, Unstarted, _Entry
from commands.dispatch.statements import start_sends
from commands.dispatch.sweep import sweep
from commands.dispatch.timing import RECORD_RETRY_FIRST_S, retry_delay
from commands.lifecycle import QUEUE_NAME
from commands.models import Attempt, Command, Connector, ConnectorHealth, HealthBucket
from commands.retry import Outlook, SkipReason
from commands.states import State
from queues.backends import get_queue
from queues.models import QueueItem

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)
VISIBILITY = timedelta(seconds=settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S)


@pytest.fixture(autouse=True)
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path / "var"
    return settings.VAR_DIR


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
def in_flight(make_connector, make_command, queue):
    """``make(n)``: ``n`` commands sent (dispatching, attempt 1, their items claimed), as
    ``(entry, sent)`` pairs with a 200 outcome, for a recorder to write."""

    def make(count: int = 1, *, ok: bool = True) -> list[tuple[_Entry, Sent]]:
        connector = make_connector()
        commands = [make_command(connector, {"n": n}) for n in range(count)]
        sweep()
        items = queue.claim(count)
        assert start_sends([(item.payload["command"], 1) for item in items], T0)
        loaded = {command.pk: command for command in Command.objects.filter(pk__in=[c.pk for c in commands])}
        outcome = (
            adapters.Outcome(ok=True, status=200)
            if ok
            else adapters.Outcome(ok=False, outlook=Outlook.AGAIN, status=503, detail="HTTP 503")
        )
        pairs = []
        for item in items:
            command = loaded[item.payload["command"]]
            command.connector = connector
            entry = _Entry(item, command, 1)
            pairs.append((entry, Sent(command, 1, T0, T0 + timedelta(seconds=1), outcome)))
        return pairs

    return make


class Refusing:
    """A write (``record_outcomes`` of the recorder's module unless named) as a database that
    refuses the first ``times`` of them sees it."""

    def __init__(self, times: int, write: str = "record_outcomes", where=recording):
        self.times = times
        self.calls = 0
        self.real = getattr(where, write)

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= self.times:
            raise OperationalError("connection refused")
        return self.real(*args, **kwargs)


def test_outcomes_the_database_refuses_are_written_once_it_takes_them(in_flight, queue, monkeypatch):
    pairs = in_flight(2)
    monkeypatch.setattr(recording, "record_outcomes", refusing := Refusing(times=3))
    pauses = []
    recorder = _Recorder(queue, pause=lambda failures: pauses.append(failures) or 0)
    try:
        for entry, sent in pairs:
            recorder.hand(entry, sent)
        assert recorder.take_results() == {"succeeded": 2}
    finally:
        recorder.close()
    assert (refusing.calls, pauses) == (4, [1, 2, 3])
    assert set(Command.objects.values_list("state", flat=True)) == {State.SUCCEEDED}
    assert Attempt.objects.filter(ok=True).count() == 2
    assert (queue.length("main"), queue.length("busy")) == (0, 0)
    assert spool.pending() == []


def test_a_start_the_database_refuses_is_tried_again_after_a_doubling_pause_not_at_once(
    make_connector, make_command, queue, monkeypatch
):
    # Starts refused while claims are not (the start thread cannot connect: too many clients)
    # put their items back, where the loop claims them again at once: without a pause, a spin.
    command = make_command(make_connector())
    sweep()
    (item,) = queue.claim(1)
    entry = _Entry(item, Command.objects.get(pk=command.pk), 1)
    monkeypatch.setattr(
        senders, "start_sends", refusing := Refusing(times=3, write="start_sends", where=senders)
    )
    pauses = []
    starts = senders._Starts(pause=lambda failures: pauses.append(failures) or 0)
    try:
        answers = [starts.start(entry, T0) for _ in range(4)]
    finally:
        starts.close()
    assert answers == [Unstarted(T0)] * 3 + [True]
    assert (refusing.calls, pauses, starts.failures) == (4, [1, 2, 3], 0)  # the success ended the run
    assert senders._Starts().pause(1) == RECORD_RETRY_FIRST_S  # then doubling, as the recorder's


def test_the_recorders_pause_doubles_from_50_ms_up_to_2_s():
    pauses = [retry_delay(n, RECORD_RETRY_FIRST_S) for n in range(1, 9)]
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_an_outcome_not_yet_written_is_not_taken_for_lost(in_flight, queue, monkeypatch, clock):
    (entry, sent), (other_entry, other_sent) = in_flight(2)
    monkeypatch.setattr(recording, "record_outcomes", Refusing(times=10**6))
    stalled = threading.Event()
    recorder = _Recorder(queue, pause=lambda failures: stalled.set() or 3600)
    try:
        recorder.hand(entry, sent)
        stalled.wait(10)
        assert recorder.pending_commands() == {sent.command.pk}
        clock.move_to(T0 + VISIBILITY + timedelta(seconds=1))
        recovered = recover(queue=queue, pending=recorder.pending_commands())
    finally:
        monkeypatch.undo()
        recorder.close()  # the last try lands: the database takes it now
    assert recovered.worker_lost == 1  # the other one, whose worker nobody vouches for
    assert Command.objects.get(pk=sent.command.pk).state == State.SUCCEEDED
    assert Command.objects.get(pk=other_sent.command.pk).last_error_class == WORKER_LOST


def test_a_recorder_that_must_close_while_the_database_refuses_spools_its_outcomes_owner_only(
    in_flight, queue, monkeypatch, var_dir
):
    pairs = in_flight(2)
    monkeypatch.setattr(recording, "record_outcomes", Refusing(times=10**6))
    recorder = _Recorder(queue, pause=lambda failures: 3600)
    for entry, sent in pairs:
        recorder.hand(entry, sent)
    recorder.close()  # one last try, woken from its pause, then the spool
    assert recorder.take_results() == {"spooled": 2}
    [path] = spool.pending()
    assert path.parent == var_dir / "spool" / "dispatch"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    records = json.loads(path.read_text())
    assert [(r["command"], r["attempt"], r["outcome"]["ok"], r["outcome"]["status"]) for r in records] == [
        (sent.command.pk, 1, True, 200) for _, sent in pairs
    ]
    assert set(Command.objects.values_list("state", flat=True)) == {State.DISPATCHING}


def spool_outcomes(pairs, queue, monkeypatch) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(recording, "record_outcomes", Refusing(times=10**6))
        recorder = _Recorder(queue, pause=lambda failures: 3600)
        for entry, sent in pairs:
            recorder.hand(entry, sent)
        recorder.close()


def test_a_spool_is_written_back_whole_and_then_removed(in_flight, queue, monkeypatch):
    pairs = in_flight(2, ok=False)
    spool_outcomes(pairs, queue, monkeypatch)
    assert replay_spool(queue) == {"failed": 2}
    assert spool.pending() == []
    rows = Command.objects.values_list("state", "last_outlook", "last_error", "skip_reason")
    # Decided as at once: "again", but the connector is not idempotent, so a person decides.
    assert set(rows) == {(State.FAILED, Outlook.AGAIN, "HTTP 503", SkipReason.NOT_IDEMPOTENT)}
    assert list(Attempt.objects.values_list("number", "status_code", "started_at")) == [(1, 503, T0)] * 2
    assert (queue.length("main"), queue.length("busy")) == (0, 0)
    assert replay_spool(queue) == {}


def test_a_spool_the_database_refuses_stays_for_the_next_try(in_flight, queue, monkeypatch):
    spool_outcomes(in_flight(1), queue, monkeypatch)
    monkeypatch.setattr(recording, "record_outcomes", Refusing(times=1))
    with pytest.raises(OperationalError):
        replay_spool(queue)
    assert len(spool.pending()) == 1
    assert replay_spool(queue) == {"succeeded": 1}
    assert spool.pending() == []


def test_a_drain_writes_the_spool_back_before_it_claims_anything(in_flight, queue, monkeypatch):
    pairs = in_flight(1)
    spool_outcomes(pairs, queue, monkeypatch)
    monkeypatch.setattr(recording, "record_outcomes", Refusing(times=1))
    claims = []
    monkeypatch.setattr(queue, "claim", lambda *a, **kw: claims.append(a) or [])
    with Dispatcher(concurrency=1, queue=queue) as dispatcher:
        with pytest.raises(OperationalError):
            dispatcher.drain()
        assert claims == []  # the spool first, or nothing
        dispatcher.drain()
    assert len(claims) == 1
    assert Command.objects.get(pk=pairs[0][1].command.pk).state == State.SUCCEEDED


def test_a_spooled_outcome_wins_over_a_recovery_that_took_the_send_for_lost(
    in_flight, queue, monkeypatch, clock
):
    [(entry, sent)] = in_flight(1)
    spool_outcomes([(entry, sent)], queue, monkeypatch)
    clock.move_to(T0 + VISIBILITY + timedelta(seconds=1))
    assert recover(queue=queue).worker_lost == 1
    lost = Command.objects.get(pk=sent.command.pk)
    assert (lost.state, lost.skip_reason) == (State.FAILED, SkipReason.OUTLOOK_UNKNOWN)

    assert replay_spool(queue) == {"succeeded": 1}
    command = Command.objects.get(pk=sent.command.pk)
    assert (command.state, command.skip_reason, command.last_error_class) == (State.SUCCEEDED, "", "")
    assert list(Attempt.objects.values_list("number", "ok", "error_class")) == [(1, True, "")]


def test_a_late_outcome_leaves_a_command_that_moved_on_since_its_recovery_alone(
    in_flight, queue, monkeypatch, clock
):
    [(entry, sent)] = in_flight(1)
    spool_outcomes([(entry, sent)], queue, monkeypatch)
    clock.move_to(T0 + VISIBILITY + timedelta(seconds=1))
    recover(queue=queue)
    Command.objects.filter(pk=sent.command.pk).update(state=State.CANCELLED)  # a person decided
    assert replay_spool(queue) == {"stale": 1}
    assert Command.objects.get(pk=sent.command.pk).state == State.CANCELLED
    assert list(Attempt.objects.values_list("error_class", flat=True)) == [WORKER_LOST]


def test_two_dispatchers_on_one_node_write_a_spool_back_once(in_flight, queue, monkeypatch):
    spool_outcomes(in_flight(1), queue, monkeypatch)
    [path] = spool.pending()
    with spool.replaying(path) as records:
        assert len(records) == 1
        assert replay_spool(queue) == {}  # held by the first: skipped
        with spool.replaying(path) as again:
            assert again is None
    assert not path.exists()
    with spool.replaying(path) as gone:
        assert gone is None


def test_recovery_runs_every_period_and_backs_off_while_it_fails(queue, monkeypatch):
    outcomes = iter([None, OperationalError("down"), OperationalError("down"), None])
    calls = []

    def recovering(**kwargs):
        calls.append(kwargs["pending"])
        failure = next(outcomes)
        if failure is not None:
            raise failure
        return RecoverSummary(worker_lost=1)

    monkeypatch.setattr(rounds, "recover", recovering)
    waits, reports = [], []
    with Dispatcher(queue=queue) as dispatcher:
        keep_recovering(
            dispatcher,
            threading.Event(),
            every=0.5,
            report=reports.append,
            wait=lambda seconds: waits.append(seconds) or len(waits) == 4,
        )
    assert waits == [0.5, 0.5, 1.0, 0.5]
    assert calls == [set()] * 4
    assert reports == [RecoverSummary(worker_lost=1)] * 2


def test_a_start_that_committed_unseen_is_undone_and_sent_once_later(
    make_connector, make_command, queue, monkeypatch
):
    command = make_command(make_connector(kind="log"))
    sweep()
    real = start_sends

    def answer_lost(wanted, now):  # the commit lands, its answer does not
        real(wanted, now)
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(senders, "start_sends", answer_lost)
    with Dispatcher(concurrency=1, queue=queue) as dispatcher:
        assert dispatcher.drain().results == {"unstarted": 1}
        assert Command.objects.get(pk=command.pk).state == State.QUEUED
        assert (queue.length("main"), queue.length("busy")) == (1, 0)
        monkeypatch.setattr(senders, "start_sends", real)
        assert dispatcher.drain().results == {"succeeded": 1}
    command.refresh_from_db()
    assert (command.state, command.attempts) == (State.SUCCEEDED, 1)
    assert list(Attempt.objects.values_list("number", "ok")) == [(1, True)]


def test_the_starts_a_closing_recorder_could_not_undo_are_undone_from_the_spool(
    make_connector, make_command, queue, monkeypatch
):
    command = make_command(make_connector(kind="log"))
    sweep()
    [item] = queue.claim(1)
    assert start_sends([(command.pk, 1)], T0) == {(command.pk, 1)}  # committed unseen
    entry = _Entry(item, Command.objects.get(pk=command.pk), 1)
    with monkeypatch.context() as patch:
        patch.setattr(recording, "undo_starts", Refusing(times=10**6, write="undo_starts"))
        recorder = _Recorder(queue, pause=lambda failures: 3600)
        recorder.hand(entry, Unstarted(T0))
        recorder.close()
    assert Command.objects.get(pk=command.pk).state == State.DISPATCHING
    assert replay_spool(queue) == {}
    assert (Command.objects.get(pk=command.pk).state, queue.length("main")) == (State.QUEUED, 1)


def test_a_stop_while_the_database_refuses_the_put_back_spools_the_items_and_they_go_back_once_it_answers(
    make_connector, make_command, queue, monkeypatch, sink
):
    # A drain told to stop puts its claimed, unstarted sends back. With the queue's database down
    # they must not wait out the visibility timeout in busy: spooled on close, they go back to the
    # head of the queue with the next drain's write-back.
    sink.delay = 0.2
    connector = make_connector(url=sink.url)
    for n in range(10):
        make_command(connector, {"n": n})
    sweep()
    real = queue.unclaim
    monkeypatch.setattr(queue, "unclaim", Refusing(times=10**6, write="unclaim", where=queue))
    with Dispatcher(concurrency=4, per_connector=2, queue=queue) as dispatcher:
        sink.respond = lambda request, nth: (dispatcher.stop.set(), (200, {}))[1]
        dispatcher.drain()
    # The two sends' outcomes may have been written before the refusals began, or spooled with them.
    assert (queue.length("main"), queue.length("busy") >= 8, len(spool.pending())) == (0, True, 1)
    monkeypatch.setattr(queue, "unclaim", real)  # the database answers again
    replay_spool(queue)
    assert (queue.length("main"), queue.length("busy")) == (8, 0)
    assert (
        sorted(Command.objects.values_list("state", "attempts"))
        == [(State.QUEUED, 0)] * 8 + [(State.SUCCEEDED, 1)] * 2
    )
    assert spool.pending() == []
    assert set(sink.counts.values()) == {1} and len(sink.counts) == 2


def test_starts_refused_by_a_full_database_strand_no_command_and_each_is_sent_once_later(
    make_connector, make_command, queue, monkeypatch, sink
):
    connector = make_connector(url=sink.url)
    commands = [make_command(connector, {"n": n}) for n in range(12)]
    sweep()
    real = start_sends

    def too_many_clients(wanted, now):  # half the statements commit unseen, half never run
        if len(wanted) % 2:
            real(wanted, now)
        raise OperationalError("FATAL: sorry, too many clients already")

    monkeypatch.setattr(senders, "start_sends", too_many_clients)
    with Dispatcher(concurrency=4, per_connector=4, queue=queue) as dispatcher:
        assert dispatcher.drain().results == {"unstarted": 12}
        # Every command waits queued with its item back in main, at once: none waits for recovery.
        assert set(Command.objects.values_list("state", "attempts")) == {(State.QUEUED, 0)}
        assert (queue.length("main"), queue.length("busy")) == (12, 0)
        assert sorted(item.payload["command"] for item in queue.peek("main", 20)) == [c.pk for c in commands]
        monkeypatch.setattr(senders, "start_sends", real)
        assert dispatcher.drain().results == {"succeeded": 12}
    assert sink.counts == {str(c.pk): 1 for c in commands}


def test_a_recorded_batch_is_one_statement_on_postgresql_and_writes_every_part(
    make_connector, make_command, queue
):
    calm, refusing = make_connector("calm"), make_connector("refusing")
    make_command(calm), make_command(refusing)
    sweep()
    items = {item.payload["command"]: item for item in queue.claim(2)}
    assert start_sends([(pk, 1) for pk in items], T0)
    ok_command, bad_command = (
        Command.objects.filter(pk__in=items).select_related("connector").order_by("connector__name")
    )
    finished = T0 + timedelta(seconds=1)
    ok_sent = Sent(ok_command, 1, T0, finished, adapters.Outcome(ok=True, status=200))
    refused = adapters.Outcome(ok=False, outlook=Outlook.NEVER, status=400, detail="HTTP 400")
    bad_sent = Sent(bad_command, 1, T0, finished, refused)
    ok_entry, bad_entry = (_Entry(items[one.command.pk], one.command, 1) for one in (ok_sent, bad_sent))
    # The succeeding connector was counting an outage run: the hold's look finds it, and its
    # success ends the run, in the same transaction.
    Connector.objects.filter(pk=ok_sent.command.connector_id).update(outage_failures=2, outage_since=T0)
    with CaptureQueriesContext(connection) as captured:
        results = record_outcomes([ok_sent, bad_sent], T0, queue=queue, items=(ok_entry.item, bad_entry.item))
    assert results == {State.SUCCEEDED.value: 1, State.FAILED.value: 1}
    if connection.vendor == "postgresql" and not stock("sql"):
        # Two groups (a success and a failure), their attempt rows, the health summary, the items'
        # end and the hold's look: one statement; then the hold's own writes for the ended run.
        statements = [query["sql"] for query in captured if query["sql"] not in ("BEGIN", "COMMIT")]
        statements = [sql for sql in statements if sql != "DISCARD PLANS"]  # after the claim's backlog
        assert [sql.split()[0] for sql in statements] == ["WITH", "UPDATE", "UPDATE"]
        assert all('"commands_connector"' in sql for sql in statements[1:])
    assert [Command.objects.get(pk=one.command.pk).state for one in (ok_sent, bad_sent)] == [
        State.SUCCEEDED,
        State.FAILED,
    ]
    assert sorted(Attempt.objects.values_list("command_id", "ok", "status_code")) == sorted(
        [(ok_sent.command.pk, True, 200), (bad_sent.command.pk, False, 400)]
    )
    health = {row.connector_id: row for row in ConnectorHealth.objects.all()}
    assert health[ok_sent.command.connector_id].last_ok_at == ok_sent.finished
    assert health[bad_sent.command.connector_id].consecutive_failures == 1
    assert sorted(HealthBucket.objects.values_list("connector_id", "sends")) == sorted(
        [(ok_sent.command.connector_id, 1)] * 2 + [(bad_sent.command.connector_id, 1)] * 2
    )
    assert Connector.objects.get(pk=ok_sent.command.connector_id).outage_failures == 0
    if queue.joins_transaction():
        assert not QueueItem.objects.filter(pk__in=[ok_entry.item.id, bad_entry.item.id]).exists()
    assert queue.length("busy") == 0


def test_a_batch_of_successes_is_a_statement_short_enough_for_psycopg_to_keep_parsed(in_flight, queue):
    if connection.vendor != "postgresql" or stock("sql") or stock("prepared"):
        pytest.skip("PostgreSQL's one statement a batch, as the driver gets it")
    pairs = in_flight(3)
    with CaptureQueriesContext(connection) as captured:
        record_outcomes(
            [sent for _, sent in pairs], T0, queue=queue, items=tuple(entry.item for entry, _ in pairs)
        )
    (statement,) = [query["sql"].split(" -- ")[0] for query in captured if query["sql"].startswith("WITH")]
    # psycopg's MAX_CACHED_STATEMENT_LENGTH: a longer statement is parsed again at every batch.
    assert len(statement.encode()) <= 4096
