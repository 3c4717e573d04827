"""``manage.py dispatch``: one round with --once, a bounded run with --max-seconds, a summary line;
between rounds, drains of what intake queued (and Celery's consume of the same)."""

from __future__ import annotations

import gc
import io
import os
import signal
import threading

import pytest
from django.core.cache import caches
from django.core.management import CommandError, call_command
from django.db import connection

from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.sweep import sweep
from commands.dispatch.timing import retry_delay
from commands.lifecycle import QUEUE_NAME, commands_queue, item_payload
from commands.management.commands.dispatch import Command as DispatchCommand
from commands.models import Command, Source
from commands.states import State
from queues.backends import get_queue
from tests.commands.conftest import HOOK_SECRET
from tests.servers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def empty_queue(transactional_db):
    get_queue(QUEUE_NAME).flush()


def test_once_runs_one_round_and_prints_its_summary(make_connector, make_command):
    command = make_command(make_connector(kind="log"))
    out = io.StringIO()
    call_command("dispatch", "--once", stdout=out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(
        "dispatch round: took 1, skipped none; claimed 1: 1 succeeded; recovered 0 lost sends"
    )
    assert lines[1] == "dispatch stopped"
    command.refresh_from_db()
    assert command.state == State.SUCCEEDED


def test_max_seconds_bounds_a_looping_run(make_connector, make_command):
    out = io.StringIO()
    call_command("dispatch", "--max-seconds", "0.5", "--interval", "0.1", stdout=out)
    rounds = [line for line in out.getvalue().splitlines() if line.startswith("dispatch round")]
    assert 2 <= len(rounds) <= 6
    assert Command.objects.count() == 0


def test_the_loop_in_a_process_of_its_own_freezes_what_start_up_loaded_and_a_callers_does_not():
    # Each collection of the oldest generation walked every object start-up loaded, holding the
    # GIL: the loop's sends stopped meanwhile (bench/README.md).
    assert gc.get_freeze_count() == 0
    try:
        call_command("dispatch", "--max-seconds", "0.2", "--interval", "0.1", stdout=io.StringIO())
        assert gc.get_freeze_count() == 0  # a caller's objects are not the loop's to freeze
        argv = ["manage.py", "dispatch", "--max-seconds", "0.2", "--interval", "0.1"]
        DispatchCommand(stdout=io.StringIO()).run_from_argv(argv)  # as manage.py runs it
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_failed_round_is_logged_and_the_loop_carries_on(monkeypatch, caplog):
    from commands.management.commands import dispatch as command_module

    real, calls = command_module.run_round, []

    def flaky(dispatcher, **options):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("database went away")
        return real(dispatcher, **options)

    monkeypatch.setattr(command_module, "run_round", flaky)
    out = io.StringIO()
    call_command("dispatch", "--max-seconds", "0.4", "--interval", "0.05", stdout=out)
    assert "dispatch round failed; retrying in 0.05 s" in caplog.text
    assert "dispatch round: took 0" in out.getvalue()
    with pytest.raises(ConnectionError):
        calls.clear()
        call_command("dispatch", "--once", stdout=io.StringIO())


class Lines(io.StringIO):
    """The command's output, telling ``first_round`` once the first round's line is written."""

    def __init__(self):
        super().__init__()
        self.first_round = threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if text.startswith("dispatch round"):
            self.first_round.set()
        return written


def test_between_rounds_the_loop_sends_what_intake_queued_without_waiting_for_a_round(
    settings, tenant, make_connector, post_hook
):
    settings.ANKUSA_DISPATCH_POLL_S = 0.05
    source = Source.objects.create(
        tenant=tenant, slug="orders", verifier="github", verifier_secrets=[HOOK_SECRET], dedupe_key="github"
    )
    source.connectors.set([make_connector("log", kind="log")])
    out, answers = Lines(), []

    def webhook_after_the_first_round() -> None:
        try:
            assert out.first_round.wait(10)
            answers.append(post_hook())
            wait_for(lambda: Command.objects.filter(state=State.SUCCEEDED).exists(), 10, "the send")
        finally:
            connection.close()
            os.kill(os.getpid(), signal.SIGTERM)

    # The loop's own stop ends the run; a SIGTERM that misses the loop (before its handler or after
    # it restored this one) must not end the test run: this is what it restores.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    thread = threading.Thread(target=webhook_after_the_first_round)
    thread.start()
    try:
        call_command("dispatch", "--interval", "60", "--max-seconds", "20", stdout=out)
    finally:
        thread.join()
        signal.signal(signal.SIGTERM, previous)
    assert answers[0].status_code == 202
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["dispatch round", "dispatch drain", "dispatch stopped"]
    assert lines[1].startswith("dispatch drain: claimed 1: 1 succeeded; ")


def test_an_empty_queue_between_rounds_starts_no_drain_and_prints_nothing(settings, monkeypatch):
    settings.ANKUSA_DISPATCH_POLL_S = 0.05
    drains = []
    real = Dispatcher.drain
    monkeypatch.setattr(Dispatcher, "drain", lambda self, **kw: drains.append(kw) or real(self, **kw))
    out = io.StringIO()
    call_command("dispatch", "--interval", "60", "--max-seconds", "0.5", stdout=out)
    lines = out.getvalue().splitlines()
    rounds = [line for line in lines if line.startswith("dispatch round")]
    assert len(rounds) + 1 == len(lines)  # and "dispatch stopped": nothing printed between rounds
    assert len(drains) == len(rounds)  # each round's own


def test_celerys_consume_of_an_empty_queue_starts_no_dispatcher(monkeypatch):
    from commands import tasks

    def refuse(*args, **kwargs):
        raise AssertionError("a dispatcher was started for an empty queue")

    monkeypatch.setattr(tasks, "Dispatcher", refuse)
    assert tasks.consume() == {"claimed": 0, "results": {}}


def test_celery_beat_recovers_at_the_loops_recovery_period_not_at_its_interval(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["commands-recover"]
    assert (entry["task"], entry["schedule"]) == ("commands.recover", settings.ANKUSA_DISPATCH_RECOVER_S)
    assert settings.ANKUSA_DISPATCH_RECOVER_S == 2.0


def test_celery_beat_polls_every_poll_period_and_drops_a_poll_left_unstarted_ten_periods(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["commands-poll"]
    assert (entry["task"], entry["schedule"]) == ("commands.poll", settings.ANKUSA_DISPATCH_POLL_S)
    assert entry["options"]["expires"] == max(10 * settings.ANKUSA_DISPATCH_POLL_S, 10.0)


def test_a_poll_while_another_poll_drains_starts_no_dispatcher(
    redis_client, make_connector, make_command, monkeypatch
):
    from commands import tasks

    commands_queue().enqueue(item_payload(make_command(make_connector(kind="log")).pk, 1))
    caches["redis"].add(tasks.POLL_LOCK, "another worker's", timeout=30)
    started = []
    real = Dispatcher
    monkeypatch.setattr(tasks, "Dispatcher", lambda *a, **kw: started.append(1) or real(*a, **kw))
    assert tasks.poll() == {"claimed": 0, "results": {}, "busy": True}
    assert started == []
    assert caches["redis"].get(tasks.POLL_LOCK) == "another worker's"  # not its to release


def test_a_poll_with_an_item_waiting_drains_it_and_releases_the_lock(
    redis_client, make_connector, make_command
):
    from commands import tasks

    command = make_command(make_connector(kind="log"))
    sweep()  # queued, with its item, as intake leaves a command it accepts
    assert tasks.poll() == {"claimed": 1, "results": {"succeeded": 1}}
    command.refresh_from_db()
    assert command.state == State.SUCCEEDED
    assert caches["redis"].get(tasks.POLL_LOCK) is None


def test_a_poll_asked_by_a_wake_drains_what_was_queued_without_a_look_first(
    redis_client, make_connector, make_command, monkeypatch
):
    from commands import tasks

    command = make_command(make_connector(kind="log"))
    sweep()  # queued, as intake's commit leaves it before the wake's poll starts
    looked = []
    monkeypatch.setattr(tasks, "items_waiting", lambda queue: looked.append(1) or True)
    assert tasks.poll(sweep=True) == {"claimed": 1, "results": {"succeeded": 1}}
    command.refresh_from_db()
    assert command.state == State.SUCCEEDED
    assert looked == []  # the drain's claim was the first read; a look would have cost a round trip


def test_a_poll_asked_by_a_wake_sends_a_command_made_due_but_not_queued(
    redis_client, make_connector, make_command
):
    from commands import tasks

    command = make_command(make_connector(kind="log"))  # approved, due: a resend, an approval
    assert tasks.poll(sweep=True) == {"claimed": 1, "results": {"succeeded": 1}}
    command.refresh_from_db()
    assert command.state == State.SUCCEEDED
    assert caches["redis"].get(tasks.POLL_LOCK) is None


def test_a_wake_that_meets_a_draining_poll_sweeps_for_it_if_nothing_waits(
    redis_client, make_connector, make_command
):
    from commands import tasks

    command = make_command(make_connector(kind="log"))
    caches["redis"].add(tasks.POLL_LOCK, "another worker's", timeout=30)
    assert tasks.poll(sweep=True) == {"claimed": 0, "results": {}, "busy": True}
    command.refresh_from_db()
    assert command.state == State.QUEUED  # for the draining poll, which claims while work is queued
    assert caches["redis"].get(tasks.POLL_LOCK) == "another worker's"


def test_a_celery_process_keeps_its_dispatcher_from_one_drain_to_the_next(
    redis_client, make_connector, make_command, monkeypatch
):
    from commands import tasks

    started = []
    monkeypatch.setattr(
        tasks, "Dispatcher", lambda *a, **kw: started.append(Dispatcher(*a, **kw)) or started[-1]
    )
    connector = make_connector(kind="log")
    for _ in range(2):
        command = make_command(connector)
        sweep()
        assert tasks.poll() == {"claimed": 1, "results": {"succeeded": 1}}
        command.refresh_from_db()
        assert command.state == State.SUCCEEDED
    assert len(started) == 1  # the second drain sent on the first one's senders


def test_a_celery_drain_while_another_of_its_process_runs_gets_a_dispatcher_of_its_own(
    redis_client, make_connector, make_command
):
    from commands import tasks

    command = make_command(make_connector(kind="log"))
    sweep()
    with tasks._kept_in_use:  # a threads pool: another task's drain is on the kept one
        assert tasks.consume() == {"claimed": 1, "results": {"succeeded": 1}}
    assert tasks._kept is None  # its own, closed at its end; nothing was kept
    command.refresh_from_db()
    assert command.state == State.SUCCEEDED


def test_a_celery_drain_that_fails_or_leaves_outcomes_unwritten_closes_its_dispatcher(
    redis_client, make_connector, make_command, monkeypatch
):
    from commands import tasks

    closed, close = [], Dispatcher.close
    monkeypatch.setattr(Dispatcher, "close", lambda self: closed.append(self) or close(self))
    connector = make_connector(kind="log")
    make_command(connector)
    sweep()
    # The database refused the outcomes until the drain's patience ran out: the close spools them.
    monkeypatch.setattr(Dispatcher, "pending_commands", lambda self: {1})
    tasks.poll()
    assert len(closed) == 1 and tasks._kept is None

    def failing(self, **kwargs):
        raise ConnectionError("the database went away")

    monkeypatch.setattr(Dispatcher, "drain", failing)
    make_command(connector)
    sweep()
    with pytest.raises(ConnectionError):
        tasks.poll()
    assert len(closed) == 2 and closed[1] is not closed[0] and tasks._kept is None


def test_a_poll_that_cannot_reach_the_lock_drains_anyway_and_says_so(
    settings, make_connector, make_command, caplog
):
    from commands import tasks

    unreachable = {**settings.CACHES["redis"], "LOCATION": "redis://127.0.0.1:1/0"}
    settings.CACHES = {**settings.CACHES, "redis": unreachable}
    command = make_command(make_connector(kind="log"))
    sweep()
    assert tasks.poll() == {"claimed": 1, "results": {"succeeded": 1}}
    command.refresh_from_db()
    assert command.state == State.SUCCEEDED
    assert "the lock could not be taken" in caplog.text


def test_a_failed_drain_is_tried_again_at_the_poll_period_doubling_to_2_s_not_at_the_next_round(
    settings, monkeypatch, caplog
):
    from commands.management.commands import dispatch as command_module

    settings.ANKUSA_DISPATCH_POLL_S = 0.25
    now, pauses, drains = [0.0], [], []

    def pause(self, stop, seconds):  # time moves instead of passing
        pauses.append(seconds)
        now[0] += seconds

    def failing(dispatcher, **options):
        drains.append(now[0])
        if len(drains) <= 6:
            raise ConnectionError("database went away")
        return None

    monkeypatch.setattr(command_module.Command, "clock", staticmethod(lambda: now[0]))
    monkeypatch.setattr(command_module.Command, "pause", pause)
    monkeypatch.setattr(command_module, "drain_waiting", failing)
    # An hour between rounds: only the drain's own retries can call it again within the run.
    call_command("dispatch", "--interval", "3600", "--max-seconds", "10", stdout=io.StringIO())
    # After the round, a poll period; then six failures, a pause doubling up to 2 s after each.
    assert pauses[:8] == [0.25, 0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 0.25]
    assert drains[:7] == [0.25, 0.5, 1.0, 2.0, 4.0, 6.0, 8.0]
    assert caplog.text.count("dispatch drain failed; retrying in 0.25 s") == 1  # the traceback once
    assert "dispatch drain failed again (database went away); retrying in 2 s" in caplog.text


def test_the_loops_retries_double_from_the_poll_period_up_to_two_seconds():
    assert [retry_delay(n, 0.25) for n in range(1, 7)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert retry_delay(3, 5.0) == 5.0  # a poll period longer than the cap is the pause


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "soon"])
@pytest.mark.parametrize("flag", ["--max-seconds", "--interval"])
def test_a_duration_that_is_no_number_of_seconds_is_refused_before_anything_runs(flag, value):
    with pytest.raises(CommandError, match="is not a number of seconds"):
        call_command("dispatch", f"{flag}={value}", stdout=io.StringIO())


def test_the_loop_gives_its_caller_the_signal_handlers_it_had():
    def mine(signum, frame):
        pass

    before = {signum: signal.signal(signum, mine) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        call_command("dispatch", "--once", stdout=io.StringIO())
        assert [signal.getsignal(signum) for signum in before] == [mine, mine]
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
