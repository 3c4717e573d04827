"""The outage hold through the real dispatcher, on a moved clock: a receiver down for an hour while
1,000 commands arrive costs no command its tries with the hold, and most of them without it."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connections
from django.db.models import Count
from django.utils import timezone

from commands.dispatch import hold
from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.rounds import run_round
from commands.dispatch.sends import Sent
from commands.dispatch.sweep import sweep
from commands.lifecycle import QUEUE_NAME, item_payload
from commands.models import Attempt, Command, Connector
from commands.retry import Outlook, SkipReason
from commands.staff.explain import explain
from commands.states import State
from queues.backends import get_queue

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)
OUTAGE = timedelta(minutes=60)
STEP = timedelta(seconds=30)  # the loop's round (ANKUSA_DISPATCH_INTERVAL_S)
COMMANDS = 1000


class Receiver:
    """A ``respond`` for the sink that is down (503: ``again``) until ``up`` is set, and counts the
    commands it took (200) by Idempotency-Key."""

    def __init__(self):
        self.up = threading.Event()
        self.taken: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, request, nth):
        if not self.up.is_set():
            return 503, {}
        if request.method == "HEAD":
            return 200, {}
        with self.lock:
            self.taken[request.key] += 1
        return 200, {}


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
    with Dispatcher(concurrency=8, per_connector=8, queue=queue) as running:
        yield running


def arrive(connector: Connector, count: int, queue) -> None:
    """``count`` new commands as intake leaves them: half approved for the sweep, half born queued
    with their item (intake's own move), which a held connector's drain must set aside."""
    for n in range(count):
        if n % 2:
            Command.objects.create(tenant=connector.tenant, connector=connector, payload={"n": n})
        else:
            command = Command.objects.create(tenant=connector.tenant, connector=connector, payload={"n": n},
                                             state=State.QUEUED, next_attempt_at=timezone.now() + STEP)  # fmt: skip
            queue.enqueue(item_payload(command.pk, 1))


def outage_hour(connector, dispatcher, clock, sink, receiver) -> None:
    """An hour down while 1,000 commands arrive (a round each 30 s), then the receiver is back."""
    sink.respond = receiver
    steps = int(OUTAGE / STEP)
    for step in range(steps):
        clock.move_to(T0 + step * STEP)
        arrive(connector, COMMANDS // steps + (1 if step < COMMANDS % steps else 0), dispatcher.queue)
        run_round(dispatcher)
    receiver.up.set()


def spent() -> int:
    """Commands whose tries are all spent (or that wait for a person after their last try)."""
    return Command.objects.filter(state=State.FAILED, attempts__gte=3).count()


def test_an_hour_long_outage_spends_no_command_with_the_hold_and_most_without(
    make_connector, dispatcher, clock, sink, settings
):
    settings.ANKUSA_RESEND_PER_S = 10.0
    connector = make_connector(url=sink.url, idempotent=True)
    receiver = Receiver()
    outage_hour(connector, dispatcher, clock, sink, receiver)
    assert Command.objects.count() == COMMANDS
    connector.refresh_from_db()
    assert connector.held_since is not None  # held all along: the probes failed
    during = Attempt.objects.count()
    # Tripped in the first rounds: the attempts made are those before it, plus one probe per
    # interval (30 s doubling up to 5 min): far fewer than the commands.
    assert during < 60, during
    # The first arrivals were retried once before the run reached 10; none has used its last try.
    assert not Command.objects.filter(attempts__gte=3).exists()

    # Back: the next probe succeeds and releases the rest at the resend rate, a round each second.
    back = T0 + OUTAGE
    released_at = None
    for second in range(int(timedelta(minutes=10).total_seconds())):
        clock.move_to(back + timedelta(seconds=second))
        run_round(dispatcher)
        connector.refresh_from_db()
        if released_at is None and connector.held_since is None:
            released_at = back + timedelta(seconds=second)
        if not Command.objects.exclude(state=State.SUCCEEDED).exists():
            break
    assert released_at is not None and released_at <= back + hold.probe_interval(99)
    assert Command.objects.filter(state=State.SUCCEEDED).count() == COMMANDS
    assert spent() == 0
    assert not Command.objects.filter(skip_reason=SkipReason.ATTEMPTS_SPENT).exists()
    # Delivered once each: the receiver took every command's Idempotency-Key exactly once.
    assert len(receiver.taken) == COMMANDS and set(receiver.taken.values()) == {1}
    # At the resend rate: no second after the release starts more than rate + 1 sends (the jitter).
    per_second = (
        Attempt.objects.filter(ok=True, started_at__gt=released_at)
        .values("started_at")
        .annotate(n=Count("id"))
        .values_list("n", flat=True)
    )
    assert max(per_second) <= settings.ANKUSA_RESEND_PER_S + 1
    last = Attempt.objects.filter(ok=True).latest("started_at").started_at
    assert last - released_at >= timedelta(seconds=(COMMANDS - 20) / settings.ANKUSA_RESEND_PER_S)


def test_the_same_outage_without_the_hold_spends_the_tries_of_most_commands(
    make_connector, dispatcher, clock, sink, settings
):
    settings.ANKUSA_HOLD_AFTER_FAILURES = 0  # the hold disabled: what it prevents
    connector = make_connector(url=sink.url, idempotent=True)
    receiver = Receiver()
    outage_hour(connector, dispatcher, clock, sink, receiver)
    # Back: a few rounds, then past the last try's 10-minute wait, when it becomes attempts-spent.
    for after in (0, 30, 60, 90, 11 * 60, 11 * 60 + 30):
        clock.move_to(T0 + OUTAGE + timedelta(seconds=after))
        run_round(dispatcher)
    connector.refresh_from_db()
    assert connector.held_since is None
    # Three tries in 12.5 minutes: every command that arrived before the last 12.5 minutes spent them.
    lost = spent()
    assert lost >= COMMANDS * (OUTAGE - timedelta(minutes=13)) / OUTAGE, lost
    assert Command.objects.filter(skip_reason=SkipReason.ATTEMPTS_SPENT).count() == lost
    assert Command.objects.filter(state=State.SUCCEEDED).count() == COMMANDS - lost  # the late ones went
    print(f"without the hold: {lost} of {COMMANDS} commands attempts-spent; with it: 0")


def test_ten_again_failures_in_a_row_across_commands_hold_and_a_success_in_between_does_not(
    make_connector, make_command, dispatcher, clock, sink
):
    receiver = Receiver()
    sink.respond = receiver
    connector = make_connector(url=sink.url, idempotent=True)
    for _ in range(9):
        make_command(connector)
    run_round(dispatcher)
    connector.refresh_from_db()
    assert (connector.outage_failures, connector.held_since) == (9, None)
    receiver.up.set()
    make_command(connector)
    run_round(dispatcher)  # one success ends the run
    connector.refresh_from_db()
    assert (connector.outage_failures, connector.outage_since) == (0, None)
    receiver.up.clear()
    for _ in range(10):
        make_command(connector)
    clock.move_to(T0 + timedelta(seconds=1))
    run_round(dispatcher)
    connector.refresh_from_db()
    assert (connector.outage_failures, connector.held_since) == (10, T0 + timedelta(seconds=1))
    assert connector.probe_at == T0 + timedelta(seconds=31)


def test_a_run_older_than_the_window_starts_again(
    make_connector, make_command, dispatcher, clock, sink, settings
):
    settings.ANKUSA_HOLD_WINDOW_S = 60
    sink.respond = Receiver()
    connector = make_connector(url=sink.url)  # not idempotent: no retries, five sends a round
    for minute in range(3):
        clock.move_to(T0 + timedelta(minutes=2 * minute))
        for _ in range(5):
            make_command(connector)
        run_round(dispatcher)
    connector.refresh_from_db()
    assert (connector.outage_failures, connector.held_since) == (5, None)


def test_counting_is_exact_with_dispatchers_in_threads(
    make_connector, make_command, queue, clock, sink, settings
):
    settings.ANKUSA_HOLD_AFTER_FAILURES = 1000
    sink.respond = Receiver()
    connector = make_connector(url=sink.url, idempotent=True)
    for _ in range(200):
        make_command(connector)
    sweep()
    errors = []

    def drain():
        try:
            with Dispatcher(concurrency=4, per_connector=4, queue=queue, batch=10) as one:
                one.drain()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    connector.refresh_from_db()
    assert Attempt.objects.count() == 200
    assert connector.outage_failures == 200


def test_a_held_connector_explains_its_commands_and_a_person_waiting_one_keeps_its_reason(
    make_connector, make_command, clock
):
    connector = make_connector(idempotent=True)
    waiting = make_command(connector)
    spent_one = make_command(connector, state=State.FAILED, attempts=3, last_outlook=Outlook.AGAIN,
                             skip_reason=SkipReason.ATTEMPTS_SPENT)  # fmt: skip
    Connector.objects.filter(pk=connector.pk).update(held_since=T0, probe_at=T0 + STEP)
    waiting = Command.objects.select_related("connector").get(pk=waiting.pk)
    said = explain(waiting)
    assert (said.key, said.by, said.at) == ("held", "machine", T0 + STEP)
    assert "since 2026-09-02 09:00" in said.line()
    assert explain(Command.objects.select_related("connector").get(pk=spent_one.pk)).key == "attempts-spent"


def test_a_held_non_idempotent_connector_is_probed_by_a_head_and_released_without_a_command_send(
    make_connector, make_command, dispatcher, clock, sink
):
    receiver = Receiver()
    sink.respond = receiver
    connector = make_connector(url=sink.url)
    command = make_command(connector)
    Connector.objects.filter(pk=connector.pk).update(held_since=T0, probe_at=T0 + STEP, outage_failures=10)
    clock.move_to(T0 + STEP)
    run_round(dispatcher)
    connector.refresh_from_db()
    assert connector.held_since is not None and connector.probes == 1
    assert connector.probe_at == T0 + STEP + hold.probe_interval(1)
    assert [r.method for r in sink.received] == ["HEAD"]
    receiver.up.set()
    released = connector.probe_at
    clock.move_to(released)
    run_round(dispatcher)  # the HEAD releases it, and the command goes at the resend rate
    connector.refresh_from_db()
    assert connector.held_since is None
    clock.move_to(released + timedelta(seconds=1))
    run_round(dispatcher)
    command.refresh_from_db()
    assert (command.state, command.attempts) == (State.SUCCEEDED, 1)
    assert receiver.taken == {str(command.pk): 1}


def sent(command, ok: bool, at: datetime, outlook=Outlook.AGAIN):
    from commands.dispatch.adapters import Outcome

    return Sent(command, 1, at, at, Outcome(ok=ok, outlook=None if ok else outlook))


def test_a_batch_counts_only_the_failures_after_its_last_other_outcome(make_connector, make_command, clock):
    connector = make_connector(idempotent=True)
    Connector.objects.filter(pk=connector.pk).update(outage_failures=7, outage_since=T0)
    command = make_command(connector)
    command.connector = connector
    later = [T0 + timedelta(seconds=s) for s in range(5)]
    # Unordered as recorders get them: a failure, a 'never' (the receiver answered), two failures.
    hold.observe([sent(command, False, later[3]), sent(command, False, later[1], Outlook.NEVER),
                  sent(command, False, later[0]), sent(command, False, later[2])], T0 + timedelta(seconds=5))  # fmt: skip
    connector.refresh_from_db()
    assert (connector.outage_failures, connector.outage_since, connector.held_since) == (2, later[2], None)
    hold.observe([sent(command, True, later[4])], later[4])
    connector.refresh_from_db()
    assert (connector.outage_failures, connector.outage_since) == (0, None)


def test_a_success_releases_a_held_connector_and_paces_its_waiting_commands(
    make_connector, make_command, clock, settings
):
    settings.ANKUSA_RESEND_PER_S = 2.0
    connector = make_connector(idempotent=True)
    waiting = [make_command(connector) for _ in range(6)]
    Connector.objects.filter(pk=connector.pk).update(held_since=T0, probe_at=T0, outage_failures=10)
    waiting[0].connector = connector
    hold.observe([sent(waiting[0], True, T0)], T0)
    connector.refresh_from_db()
    assert (connector.held_since, connector.probe_at, connector.outage_failures) == (None, None, 0)
    due = list(Command.objects.order_by("pk").values_list("next_attempt_at", flat=True))
    assert all(
        T0 + timedelta(seconds=i / 2) <= at <= T0 + timedelta(seconds=i / 2 + 0.25)
        for i, at in enumerate(due)
    )
