"""The dispatch loop is woken, not left to its poll (``queues.wake``, ``commands.wake``): a command
queued, a connector saved, a resend — each goes within far less than the poll period, with the
loop in a thread and as a real ``manage.py dispatch`` process, and a Celery worker asked on commit;
a lost wake waits for the poll."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time

import pytest
from django.conf import settings
from django.db import connection, connections, transaction

from commands.dispatch.sweep import sweep
from commands.lifecycle import QUEUE_NAME, item_payload
from commands.management.commands.dispatch import Command as DispatchCommand
from commands.models import Command
from commands.retry import Outlook
from commands.staff import actions
from commands.states import State
from queues import wake
from queues.backends import get_queue
from tests.commands.sink import Sink
from tests.queues.test_wake import listeners
from tests.servers import wait_for
from tests.staff import staff_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The loop polls every 30 s here: only a wake can send within WAKE_BOUND_S.
POLL_S = 30.0
WAKE_BOUND_S = 3.0


@pytest.fixture(params=["database", "redis"])
def backend(request, settings):
    if request.param == "database":
        if connection.vendor != "postgresql":
            pytest.skip("PostgreSQL-only: SQLite polls")
    else:
        request.getfixturevalue("django_redis")
    settings.ANKUSA_QUEUE_BACKEND = request.param
    get_queue(QUEUE_NAME).flush()
    yield request.param
    wake.close_listeners()


class LoopThread:
    """``manage.py dispatch``'s loop in a thread of this process (one round an hour)."""

    def __init__(self):
        self.stop = threading.Event()
        self.out = io.StringIO()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_for(lambda: "dispatch round" in self.out.getvalue(), what="the first round")
        time.sleep(0.3)  # waiting (and, on PostgreSQL, listening) by now

    def _run(self):
        try:
            DispatchCommand(stdout=self.out).run(self.stop, interval=3600)
        finally:
            connections.close_all()  # this thread's own

    def close(self):
        self.stop.set()
        self.thread.join(30)


class LoopProcess:
    """A real ``manage.py dispatch`` (one round an hour, a poll every ``poll`` seconds)."""

    def __init__(self, env: dict, backend: str, poll: float = POLL_S):
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "dispatch", "--interval", "3600"],
            cwd=settings.BASE_DIR,
            env={**env, "ANKUSA_QUEUE_BACKEND": backend, "ANKUSA_DISPATCH_POLL_S": str(poll)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.process.stdout.readline()
        assert "dispatch round" in line, line
        if backend == "database":
            wait_for(listeners, what="the process to listen")
        time.sleep(0.3)

    def close(self) -> str:
        self.process.terminate()
        output, _ = self.process.communicate(timeout=30)
        return output


@pytest.fixture(params=["thread", "process"])
def loop(request, backend, settings, service_env):
    settings.ANKUSA_DISPATCH_POLL_S = POLL_S
    running = LoopThread() if request.param == "thread" else LoopProcess(service_env, backend)
    yield running
    running.close()


def sent_within(command: Command, bound: float) -> float:
    started = time.monotonic()
    wait_for(
        lambda: Command.objects.get(pk=command.pk).state == State.SUCCEEDED,
        timeout=bound,
        what=f"command {command.pk} to be sent within {bound} s",
    )
    return time.monotonic() - started


def test_a_queued_command_is_sent_at_once_not_at_the_next_poll(loop, make_connector, make_command):
    command = make_command(make_connector(kind="log"))
    sweep()  # queued and committed: the commit wakes the loop
    assert sent_within(command, WAKE_BOUND_S) < WAKE_BOUND_S


def test_a_saved_connector_sends_its_after_fix_commands_at_once(loop, make_connector, make_command):
    connector = make_connector(kind="log", idempotent=True)
    command = make_command(connector, state=State.FAILED, attempts=1, last_outlook=Outlook.AFTER_FIX)
    connector.name = "fixed"
    connector.save()  # re-decides its commands and queues them in the save's transaction
    assert sent_within(command, WAKE_BOUND_S) < WAKE_BOUND_S


def test_a_resend_is_sent_at_once(loop, make_connector, make_command):
    connector = make_connector(kind="log", idempotent=True)
    command = make_command(connector, state=State.FAILED, attempts=1, last_outlook=Outlook.AGAIN)
    Command.objects.filter(pk=command.pk).update(skip_reason="", next_attempt_at=None)
    done = actions.perform(
        "resend", Command.objects.filter(pk=command.pk), user=staff_user("operator"), via="api"
    )
    assert done.done == 1
    assert sent_within(command, WAKE_BOUND_S) < WAKE_BOUND_S


def test_a_rolled_back_enqueue_wakes_no_loop_and_sends_nothing(loop, backend, make_connector, make_command):
    command = make_command(make_connector(kind="log"))
    with pytest.raises(RuntimeError), transaction.atomic():
        sweep()
        raise RuntimeError("rolled back")
    time.sleep(1.0)
    assert Command.objects.get(pk=command.pk).state == State.APPROVED
    assert get_queue(QUEUE_NAME).length() == 0


def test_a_lost_wake_is_caught_by_the_poll(postgres, make_connector, make_command, service_env, settings):
    settings.ANKUSA_QUEUE_BACKEND = "database"
    get_queue(QUEUE_NAME).flush()
    process = LoopProcess(service_env, "database", poll=2.0)
    try:
        command = make_command(make_connector(kind="log"))
        with transaction.atomic(), connection.cursor() as cursor:
            # Triggers off for this transaction only: its enqueue sends no NOTIFY (a lost wake).
            cursor.execute("SET LOCAL session_replication_role = replica")
            sweep()
        time.sleep(0.5)
        assert Command.objects.get(pk=command.pk).state == State.QUEUED  # nothing woke the loop
        sent_within(command, 2.0 + WAKE_BOUND_S)  # the poll found it
    finally:
        process.close()


def test_under_celery_a_commit_that_queues_or_resends_asks_a_worker_at_once(
    make_connector, make_command, redis_client, service_env, settings
):
    from tests.commands.test_processes import celery_worker, stop

    settings.ANKUSA_DISPATCH_CELERY_WAKE = True
    get_queue(QUEUE_NAME).flush()
    # No beat: only the ask made on commit can start a drain.
    worker = celery_worker({**service_env, "ANKUSA_DISPATCH_CELERY_WAKE": "1"})
    try:
        connector = make_connector(kind="log", idempotent=True)
        queued = make_command(connector)
        sweep()  # queued and committed: poll asked for on commit
        wait_for(lambda: Command.objects.get(pk=queued.pk).state == State.SUCCEEDED, timeout=60)
        resent = make_command(connector, state=State.FAILED, attempts=1, last_outlook=Outlook.AGAIN)
        actions.perform(
            "resend", Command.objects.filter(pk=resent.pk), user=staff_user("operator"), via="api"
        )
        wait_for(lambda: Command.objects.get(pk=resent.pk).state == State.SUCCEEDED, timeout=60)
    finally:
        output = stop(worker)
    assert "Task commands.poll[" in output


def test_a_resumed_connector_sends_its_waiting_commands_at_once(loop, make_connector, make_command):
    from commands.staff import pausing

    connector = make_connector(kind="log", idempotent=True)
    pausing.pause(connector, user=staff_user("operator"), via="api", reason="receiver migrating")
    command = make_command(connector)
    sweep()  # the pause keeps it waiting
    time.sleep(0.5)
    assert Command.objects.get(pk=command.pk).state == State.APPROVED
    pausing.resume(connector, user=staff_user("admin"), via="api")  # released: wakes the loop
    assert sent_within(command, WAKE_BOUND_S) < WAKE_BOUND_S


def test_commands_queued_while_the_loop_sends_go_at_once_and_their_commits_wake_no_one(
    loop, backend, make_connector, make_command
):
    # A drain with sends in flight claims again by itself: on PostgreSQL it does not hold the wake
    # gate, so the commits that queue meanwhile send no NOTIFY (which would make them take turns).
    from tests.queues.test_wake import notified, raw_listener

    queue = get_queue(QUEUE_NAME)
    watcher = raw_listener() if backend == "database" else None
    with Sink(delay=0.2) as slow:  # every send stays in flight a while: the loop is never idle
        connector = make_connector(url=slow.url, max_in_flight=100)
        queued_at: dict[str, float] = {}

        def produce(count: int) -> None:
            try:
                for _ in range(count):
                    command = make_command(connector, state=State.QUEUED)
                    queue.enqueue(item_payload(command.pk, 1))
                    queued_at[str(command.pk)] = time.time()
                    time.sleep(0.05)
            finally:
                connections.close_all()  # this thread's own

        producers = [threading.Thread(target=produce, args=(20,)) for _ in range(2)]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join(30)
        wait_for(lambda: len(slow.first_at) == 40, timeout=WAKE_BOUND_S + 5, what="every send")
        waited = sorted(slow.first_at[key] - queued_at[key] for key in queued_at)
    assert slow.keys_received_more_than_once() == {}
    assert waited[-1] < WAKE_BOUND_S, waited
    if watcher is not None:
        # The loop slept when the first commit came: that one woke it; so may one that came just
        # as a drain ended. The rest found it claiming.
        assert len(notified(watcher)) <= 4
        watcher.close()
