"""Staff actions (``commands.staff.actions``): the dry run's breakdown, the guards, the compare-and-set,
the audit row, the spread of a bulk resend, and a resend going out once through the real loop."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db import connections

from commands.dispatch.dispatcher import Dispatcher
from commands.dispatch.rounds import run_round
from commands.lifecycle import QUEUE_NAME
from commands.models import Attempt, AuditEntry, Command
from commands.retry import Outlook, SkipReason
from commands.staff import actions
from commands.states import State
from limits.authentication import TenantClient
from limits.models import ApiToken
from queues.backends import get_queue
from tests.commands.sink import script
from tests.staff import staff_user

T0 = datetime(2026, 9, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def staff(db):
    """``staff("operator")``: a staff user in that group (the groups come from a migration, and
    again after a transactional test's flush)."""

    return staff_user


@pytest.fixture
def failed(make_connector, make_command):
    """One failed command of each kind a resend tells apart, and one that succeeded."""
    idempotent = make_connector("idem", idempotent=True, url="http://127.0.0.1:9/")
    plain = make_connector("plain", url="http://127.0.0.1:9/")

    def fail(connector, outlook, **fields):
        fields = {"state": State.FAILED, "attempts": 1, "last_outlook": outlook, **fields}
        return make_command(connector, **fields)

    return {
        "again": fail(idempotent, Outlook.AGAIN, attempts=3, skip_reason=SkipReason.ATTEMPTS_SPENT),
        "after_fix": fail(idempotent, Outlook.AFTER_FIX),
        "not_idempotent": fail(plain, Outlook.AGAIN, skip_reason=SkipReason.NOT_IDEMPOTENT),
        "unknown": fail(idempotent, "", skip_reason=SkipReason.OUTLOOK_UNKNOWN),
        "never": fail(idempotent, Outlook.NEVER, skip_reason=SkipReason.NEVER),
        "succeeded": make_command(idempotent, state=State.SUCCEEDED, attempts=1),
    }


def test_the_dry_run_breaks_a_resend_down_by_eligibility_and_writes_nothing(failed):
    before = list(Command.objects.order_by("pk").values())
    plan = actions.plan("resend", Command.objects.all())
    assert (plan.total, plan.will) == (6, 2)
    assert plan.need_override == {"connector not idempotent": 1, "outlook unknown": 1}
    assert plan.cannot == {"never: make a new command instead": 1, "not failed": 1}
    assert plan.summary() == (
        "2 will be resent, 2 need an override: 1 connector not idempotent, 1 outlook unknown; "
        "2 cannot: 1 never: make a new command instead, 1 not failed"
    )
    assert actions.plan("resend", Command.objects.all(), override=True).will == 4
    assert plan.overridden() == actions.plan("resend", Command.objects.all(), override=True)
    assert list(Command.objects.order_by("pk").values()) == before
    assert not AuditEntry.objects.exists()


def test_a_plan_for_a_user_needs_that_users_permission_override_included(failed, staff):
    everything = Command.objects.all()
    with pytest.raises(PermissionDenied):
        actions.plan("resend", everything, override=True, user=staff("operator"))
    assert actions.plan("resend", everything, user=staff("operator", "op2")).will == 2
    with_override = actions.plan("resend", everything, override=True, user=staff("admin"))
    assert with_override.will == 4


def test_a_resend_without_override_marks_only_what_the_machine_could_retry_and_audits_it(failed, staff):
    operator = staff("operator")
    done = actions.perform("resend", Command.objects.all(), user=operator, via="admin", now=T0)
    assert (done.total, done.done) == (6, 2)
    marked = set(Command.objects.filter(resend_by=operator).values_list("pk", flat=True))
    assert marked == {failed["again"].pk, failed["after_fix"].pk}
    again = Command.objects.get(pk=failed["again"].pk)
    assert (again.state, again.skip_reason, again.next_attempt_at >= T0) == (State.FAILED, "", True)
    entry = AuditEntry.objects.get()
    assert (entry.user, entry.username, entry.action, entry.via, entry.count, entry.done) == (
        operator,
        "operator",
        "resend",
        "admin",
        6,
        2,
    )
    assert set(entry.commands.values_list("pk", flat=True)) == marked
    assert entry.result["skipped"]["connector not idempotent"] == 1
    # A second resend of the same commands finds them pending: nothing to do, refused, no audit row.
    with pytest.raises(actions.Refused) as refused:
        actions.perform("resend", Command.objects.all(), user=operator, via="api")
    assert refused.value.code == "nothing_to_do"
    assert AuditEntry.objects.count() == 1


def test_an_override_needs_the_permission_and_a_typed_reason(failed, staff):
    risky = Command.objects.filter(pk__in=[failed["not_idempotent"].pk, failed["unknown"].pk])
    with pytest.raises(PermissionDenied):
        actions.perform("resend", risky, user=staff("operator"), via="admin", override=True, reason="checked")
    admin = staff("admin")
    with pytest.raises(actions.Refused) as refused:
        actions.perform("resend", risky, user=admin, via="admin", override=True, reason="  ")
    assert refused.value.code == "reason_required"
    done = actions.perform(
        "resend", risky, user=admin, via="api", override=True, reason="receiver confirmed it never arrived"
    )
    assert done.done == 2
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.reason) == ("resend-override", "receiver confirmed it never arrived")


def test_a_viewer_and_a_tenant_token_may_run_no_action(failed, staff, tenant):
    viewer = staff("viewer")
    token = ApiToken.objects.create(name="t", tenant=tenant, key_id="k" * 12, key_hash="x")
    for user in (viewer, TenantClient(tenant, token)):
        for action in actions.ACTIONS:
            with pytest.raises(PermissionDenied):
                actions.perform(action, Command.objects.all(), user=user, via="api")
        with pytest.raises(PermissionDenied):
            actions.new_command(failed["never"], user=user, via="api")
    assert not AuditEntry.objects.exists()


def test_cancel_takes_drafts_approved_and_failed_never_what_is_in_flight_or_finished(
    make_connector, make_command, staff
):
    connector = make_connector(kind="log")
    states = [State.DRAFT, State.APPROVED, State.FAILED, State.QUEUED, State.DISPATCHING, State.SUCCEEDED]
    commands = {state: make_command(connector, state=state) for state in states}
    plan = actions.plan("cancel", Command.objects.all())
    assert (plan.will, plan.cannot) == (
        3,
        {"in flight: wait for its send to finish": 2, "already finished": 1},
    )
    actions.perform(
        "cancel", Command.objects.all(), user=staff("operator"), via="admin", reason="duplicate order"
    )
    assert {state: Command.objects.get(pk=c.pk).state for state, c in commands.items()} == {
        State.DRAFT: State.CANCELLED,
        State.APPROVED: State.CANCELLED,
        State.FAILED: State.CANCELLED,
        State.QUEUED: State.QUEUED,
        State.DISPATCHING: State.DISPATCHING,
        State.SUCCEEDED: State.SUCCEEDED,
    }


def test_approve_moves_drafts_and_records_who(make_connector, make_command, staff):
    connector = make_connector(kind="log")
    draft = make_command(connector, state=State.DRAFT)
    make_command(connector, state=State.APPROVED)
    operator = staff("operator")
    done = actions.perform("approve", Command.objects.all(), user=operator, via="api", now=T0)
    assert (done.done, done.skipped) == (1, {"not a draft": 1})
    draft.refresh_from_db()
    assert (draft.state, draft.approved_by, draft.approved_at) == (State.APPROVED, operator, T0)


def test_a_new_command_cancels_the_never_original_and_links_an_approved_copy(failed, staff):
    original = failed["never"]
    copy = actions.new_command(original, user=staff("operator"), via="admin", payload={"sku": "fixed"})
    original.refresh_from_db()
    assert original.state == State.CANCELLED
    assert (copy.state, copy.payload, copy.resent_from, copy.connector_id) == (
        State.APPROVED,
        {"sku": "fixed"},
        original,
        original.connector_id,
    )
    assert list(original.resent_as.all()) == [copy]
    with pytest.raises(actions.Refused) as refused:
        actions.new_command(original, user=staff("admin"), via="admin")
    assert refused.value.code == "not_failed"
    entry = AuditEntry.objects.get()
    assert entry.result == {"original": original.pk, "new": copy.pk, "payload_changed": True}


def test_a_bulk_resend_spreads_due_times_at_the_configured_rate_with_jitter(
    make_connector, make_command, staff, settings
):
    settings.ANKUSA_RESEND_PER_S = 5
    connector = make_connector(kind="log", idempotent=True)
    for _ in range(40):
        make_command(connector, state=State.FAILED, attempts=1, last_outlook=Outlook.AFTER_FIX)
    actions.perform("resend", Command.objects.all(), user=staff("operator"), via="admin", now=T0)
    due = sorted(Command.objects.values_list("next_attempt_at", flat=True))
    offsets = [(when - T0).total_seconds() for when in due]
    assert offsets[0] >= 0 and offsets[-1] < 40 / 5 + 1
    # No second holds more than the rate (plus one at its edge), whichever second it is.
    assert max(sum(start <= t < start + 1 for t in offsets) for start in offsets) <= 5 + 1
    # Jittered: not exactly on the slots.
    assert any(t * 5 != int(t * 5) for t in offsets)


def test_the_resend_guard_is_repeated_at_write_time(failed, staff):
    """A command that changed between the dry run (or the id read) and the write is not touched."""
    chosen = Command.objects.filter(pk=failed["after_fix"].pk)
    Command.objects.filter(pk=failed["after_fix"].pk).update(last_outlook=Outlook.NEVER)
    with pytest.raises(actions.Refused) as refused:
        actions.perform("resend", chosen, user=staff("operator"), via="admin")
    assert refused.value.code == "nothing_to_do"
    assert Command.objects.get(pk=failed["after_fix"].pk).resend_by is None


# --- through the real loop ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_resent_non_idempotent_command_goes_out_once_then_waits_for_a_person_again(
    make_connector, make_command, staff, sink
):
    queue = get_queue(QUEUE_NAME)
    queue.flush()
    sink.respond = script(503, 503)
    command = make_command(make_connector(url=sink.url), {"order": "A-1"})
    with (
        time_machine.travel(T0, tick=False) as clock,
        Dispatcher(concurrency=2, queue=queue) as loop,
    ):
        run_round(loop)
        command.refresh_from_db()
        assert (command.state, command.skip_reason) == (State.FAILED, SkipReason.NOT_IDEMPOTENT)

        admin = staff("admin")
        actions.perform(
            "resend",
            Command.objects.filter(pk=command.pk),
            user=admin,
            via="admin",
            override=True,
            reason="receiver says it never arrived",
        )
        clock.move_to(T0 + timedelta(seconds=1))
        run_round(loop)
        assert len(sink.received) == 2
        command.refresh_from_db()
        # It failed again: the resend is spent, and it waits for a person, not for the machine.
        assert (command.state, command.resend_by, command.skip_reason, command.attempts) == (
            State.FAILED,
            None,
            SkipReason.NOT_IDEMPOTENT,
            2,
        )
        manual = Attempt.objects.get(command=command, number=2)
        assert (manual.manual, manual.manual_by) == (True, admin)
        for minutes in (1, 10, 60):
            clock.move_to(T0 + timedelta(minutes=minutes))
            run_round(loop)
        assert len(sink.received) == 2


# --- one winner ------------------------------------------------------------------------------------

RESEND_SNIPPET = """
from django.contrib.auth.models import User
from commands.staff import actions
from commands.models import Command
try:
    done = actions.perform("resend", Command.objects.filter(pk={pk}), user=User.objects.get(username="admin"),
                           via="api", override=True, reason="race").done
except actions.Refused:  # it came after the winner: nothing left to resend
    done = -1
print("DONE", done)
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_of_many_threads_and_processes_resending_one_command_one_wins(failed, staff, service_env):
    staff("admin")
    target = failed["unknown"]
    results: list[int] = []

    def resend_in_thread():
        try:
            user = User.objects.get(username="admin")
            done = actions.perform(
                "resend",
                Command.objects.filter(pk=target.pk),
                user=user,
                via="api",
                override=True,
                reason="race",
            )
            results.append(done.done)
        except actions.Refused:
            results.append(-1)
        finally:
            connections.close_all()

    snippet = RESEND_SNIPPET.format(pk=target.pk)
    processes = [
        subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", snippet],
            cwd=settings.BASE_DIR,
            env=service_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    threads = [threading.Thread(target=resend_in_thread) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for process in processes:
        output, _ = process.communicate(timeout=120)
        assert process.returncode == 0, output
        results.append(int(output.split("DONE")[-1]))
    # One wins; each other one lost the compare-and-set (0, audited) or came after it (refused).
    assert sorted(results)[-2:] == [0 if 0 in results else -1, 1] and results.count(1) == 1
    assert AuditEntry.objects.filter(done=1).count() == 1
    assert AuditEntry.objects.count() == 1 + results.count(0)


@pytest.mark.slow
def test_a_bulk_resend_of_forty_thousand_commands_is_done_and_audited_whole(make_connector, staff, tenant):
    connector = make_connector(kind="log", idempotent=True)
    Command.objects.bulk_create(
        [
            Command(
                tenant=tenant,
                connector=connector,
                state=State.FAILED,
                attempts=1,
                last_outlook=Outlook.AFTER_FIX,
            )
            for _ in range(40_000)
        ],
        batch_size=2000,
    )
    done = actions.perform("resend", Command.objects.all(), user=staff("operator"), via="api", now=T0)
    assert done.done == 40_000
    assert AuditEntry.objects.get().commands.count() == 40_000


@pytest.mark.parametrize("action", ["resend", "cancel"])
def test_a_reason_holding_a_nul_is_refused_before_anything_changes(failed, staff, action):
    command = failed["again"]
    with pytest.raises(actions.Refused) as refused:
        actions.perform(
            action,
            Command.objects.filter(pk=command.pk),
            user=staff("admin"),
            via="admin",
            reason="fixed\x00",
        )
    assert refused.value.code == "reason_invalid"
    assert not AuditEntry.objects.exists()
    command.refresh_from_db()
    assert command.state == State.FAILED
