"""Retention: old finished rows go, in batches, and nothing that still waits is touched."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from commands import retention
from commands.models import Attempt, AuditEntry, Command, Delivery
from commands.states import State

NOW = timezone.now()
OLD = NOW - timedelta(days=40)
RECENT = NOW - timedelta(days=5)


@pytest.fixture
def connector(make_connector):
    return make_connector("archive", kind="log")


@pytest.fixture
def delivery(tenant, hook_source):
    def make(received_at=OLD, key=""):
        return Delivery.objects.create(
            tenant=tenant, source=hook_source, size=2, received_at=received_at, event_key=key
        )

    return make


def command(make_command, connector, state, changed_at, **fields):
    made = make_command(connector, state=state, state_changed_at=changed_at, **fields)
    Attempt.objects.create(command=made, number=1, started_at=changed_at, ok=state == State.SUCCEEDED)
    return made


def test_old_finished_commands_go_with_their_attempts(make_command, connector):
    gone = [command(make_command, connector, state, OLD) for state in (State.SUCCEEDED, State.CANCELLED)]
    report = retention.prune(now=NOW, pause_s=0)
    assert not Command.objects.filter(pk__in=[c.pk for c in gone]).exists()
    assert Attempt.objects.count() == 0
    assert report.removed == {"commands.Command": 2, "commands.Attempt": 2}


@pytest.mark.parametrize(
    "state", [State.DRAFT, State.APPROVED, State.QUEUED, State.DISPATCHING, State.FAILED]
)
def test_a_command_that_is_not_finished_is_never_touched_whatever_its_age(make_command, connector, state):
    kept = command(make_command, connector, state, NOW - timedelta(days=3650))
    assert retention.prune(now=NOW, pause_s=0).removed == {}
    assert Command.objects.get(pk=kept.pk).attempt_set.count() == 1


def test_recent_finished_commands_stay(make_command, connector):
    kept = command(make_command, connector, State.SUCCEEDED, RECENT)
    retention.prune(now=NOW, pause_s=0)
    assert Command.objects.filter(pk=kept.pk).exists()


def test_a_delivery_stays_while_one_of_its_commands_stays(make_command, connector, delivery):
    origin = delivery()
    command(make_command, connector, State.FAILED, OLD, delivery=origin)
    command(make_command, connector, State.SUCCEEDED, OLD, delivery=origin)
    retention.prune(now=NOW, pause_s=0)
    assert Delivery.objects.filter(pk=origin.pk).exists()
    assert Command.objects.filter(delivery=origin).count() == 1


def test_an_old_delivery_goes_once_its_finished_commands_are_gone(make_command, connector, delivery):
    origin = delivery()
    command(make_command, connector, State.SUCCEEDED, OLD, delivery=origin)
    recent = delivery(received_at=RECENT)
    report = retention.prune(now=NOW, pause_s=0)
    assert list(Delivery.objects.values_list("pk", flat=True)) == [recent.pk]
    assert report.removed["commands.Delivery"] == 1


def test_a_resent_copy_outlives_its_pruned_original(make_command, connector):
    original = command(make_command, connector, State.CANCELLED, OLD)
    copy = command(make_command, connector, State.FAILED, RECENT, resent_from=original)
    retention.prune(now=NOW, pause_s=0)
    copy.refresh_from_db()
    assert copy.resent_from is None


def test_audit_entries_go_after_their_own_retention_with_their_links(make_command, connector, settings):
    settings.ANKUSA_RETAIN_AUDIT_DAYS = 30
    waiting = command(make_command, connector, State.FAILED, OLD)
    entries = {}
    for name, at in (("old", OLD), ("recent", RECENT)):
        entries[name] = AuditEntry.objects.create(
            at=at, username="ops", action="resend", via="admin", count=1, done=1
        )
        entries[name].commands.add(waiting)
    report = retention.prune(now=NOW, pause_s=0, only=["audit"])
    assert report.removed == {"commands.AuditEntry": 1, "commands.AuditEntry_commands": 1}
    assert list(AuditEntry.objects.all()) == [entries["recent"]]
    assert list(waiting.audit_entries.all()) == [entries["recent"]]


def test_batches_are_bounded(make_command, connector):
    for _ in range(5):
        command(make_command, connector, State.SUCCEEDED, OLD)
    report = retention.prune(now=NOW, batch=2, pause_s=0, only=["commands"])
    assert (report.batches, report.removed["commands.Command"]) == (3, 5)


def test_a_dry_run_counts_and_deletes_nothing(make_command, connector):
    command(make_command, connector, State.SUCCEEDED, OLD)
    assert retention.prune(now=NOW, dry_run=True).removed == {"commands.Command": 1}
    assert Command.objects.count() == 1


def test_one_cutoff_overrides_every_tables_default(make_command, connector):
    command(make_command, connector, State.SUCCEEDED, RECENT)
    retention.prune(now=NOW, older_than=timedelta(days=1), pause_s=0)
    assert Command.objects.count() == 0


def test_the_command_reports_what_it_removed(make_command, connector, capsys):
    command(make_command, connector, State.SUCCEEDED, NOW - timedelta(days=2))
    call_command("prune", "--older-than", "1d", "--pause", "0")
    assert capsys.readouterr().out.strip() == "removed 1 commands.Attempt, 1 commands.Command in 1 batch(es)"


@pytest.mark.parametrize("value", ["30", "30 days", "-1d", "1w", "0d"])
def test_the_command_refuses_a_cutoff_it_cannot_read(value, db):
    with pytest.raises(CommandError, match="--older-than"):
        call_command("prune", "--older-than", value)


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_the_command_refuses_a_pause_that_is_no_number_of_seconds(value, db):
    with pytest.raises(CommandError, match="is not a number of seconds"):
        call_command("prune", f"--pause={value}")


@pytest.mark.slow
def test_two_hundred_thousand_rows_lose_exactly_the_old_finished_ones_while_intake_answers(
    transactional_db, hook_source, connector, post_hook, service_env
):
    """80,000 old finished commands with 80,000 attempts (160,000 rows) go; 20,000 old unfinished,
    20,000 recent finished and their attempts stay — while webhooks keep being accepted."""
    tenant = hook_source.tenant

    def rows(n, state, changed_at):
        return [
            Command(tenant=tenant, connector=connector, state=state, state_changed_at=changed_at, payload={})
            for _ in range(n)
        ]

    made = Command.objects.bulk_create(
        rows(80_000, State.SUCCEEDED, OLD) + rows(10_000, State.FAILED, OLD) + rows(10_000, State.DRAFT, OLD),
        batch_size=5000,
    )
    made += Command.objects.bulk_create(rows(20_000, State.SUCCEEDED, RECENT), batch_size=5000)
    Attempt.objects.bulk_create(
        [Attempt(command_id=c.pk, number=1, started_at=c.state_changed_at) for c in made[:80_000]],
        batch_size=5000,
    )
    kept_ids = {c.pk for c in made[80_000:]}

    pruner = subprocess.Popen(
        [sys.executable, "manage.py", "prune", "--batch", "2000"],
        cwd=settings.BASE_DIR,
        env=service_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    answers, slowest, n = [], 0.0, 0
    while pruner.poll() is None and n < 2000:
        started = time.perf_counter()
        answers.append(post_hook(delivery=f"during-prune-{n}").status_code)
        slowest = max(slowest, time.perf_counter() - started)
        n += 1
    out, err = pruner.communicate(timeout=300)
    assert pruner.returncode == 0, err

    assert out.strip().endswith("removed 80000 commands.Attempt, 80000 commands.Command in 40 batch(es)")
    assert answers and set(answers) == {202}
    assert slowest < 5.0  # one batch at most stands between a webhook and the database
    remaining = set(Command.objects.filter(delivery__isnull=True).values_list("pk", flat=True))
    assert remaining == kept_ids
    assert Command.objects.filter(delivery__isnull=False).count() == 2 * len(answers)
