"""``manage.py queues``: stats, recover, requeue-failed, remove-failed, flush."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.management import CommandError, call_command

from queues.backends.database import DatabaseFIFO
from queues.backends.redis import RedisFIFO

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*args, stdout=None) -> str:
    out = stdout or io.StringIO()
    call_command("queues", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def failed_items(queue, count: int) -> None:
    """``count`` items in the failed list, in one call (a requeue limit of 0 fails on requeue)."""
    queue.requeue_limit = 0
    queue.enqueue(*range(count))
    queue.requeue(*queue.claim(count))


def test_stats_lists_every_queue_of_both_backends(db, django_redis, settings):
    settings.ANKUSA_QUEUE_BACKENDS = {"mail": "redis"}
    DatabaseFIFO("commands").enqueue("a", "b")
    RedisFIFO("mail").enqueue("m")
    lines = run("stats").splitlines()
    assert lines[0].split() == ["queue", "backend", "main", "busy", "failed", "oldest", "(s)"]
    assert [line.split()[:5] for line in lines[1:]] == [
        ["commands", "database", "2", "0", "0"],
        ["mail", "redis", "1", "0", "0"],
    ]


def test_stats_as_json_for_one_named_queue(db):
    DatabaseFIFO("commands").enqueue("a")
    data = json.loads(run("stats", "--queue", "commands", "--json"))
    assert [(row["name"], row["main"]["length"]) for row in data["queues"]] == [("commands", 1)]


def test_recover_requeues_items_claimed_longer_than_the_visibility_timeout(db, settings):
    settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S = 300
    queue = DatabaseFIFO("commands")
    with time_machine.travel(T0, tick=False) as traveller:
        queue.enqueue("stuck", "fresh")
        queue.claim()
        traveller.shift(timedelta(minutes=4))
        queue.claim()
        traveller.shift(timedelta(minutes=2))
        output = run("recover")
    assert output == "database queue commands: 1 expired item(s): requeue\n"
    assert [item.payload for item in queue.peek("main")] == ["stuck"]
    assert [item.payload for item in queue.peek("busy")] == ["fresh"]


def test_recover_can_fail_expired_items_after_a_given_time(db):
    queue = DatabaseFIFO("commands")
    with time_machine.travel(T0, tick=False) as traveller:
        queue.enqueue("stuck")
        queue.claim()
        traveller.shift(timedelta(seconds=61))
        run("recover", "--queue", "commands", "--older-than", "60", "--action", "fail")
    assert queue.peek("failed")[0].last_error == "claim expired (held longer than 60 s)"


def test_a_run_with_nothing_to_do_is_silent_in_cron(db):
    DatabaseFIFO("commands").enqueue("a")
    assert run("recover") == ""
    assert run("requeue-failed") == ""
    assert run("remove-failed") == ""


def test_a_run_on_a_terminal_says_what_it_did_even_when_nothing(db):
    DatabaseFIFO("commands").enqueue("a")
    assert run("recover", stdout=Terminal()) == "database queue commands: 0 expired item(s): requeue\n"


def test_requeue_failed_and_remove_failed(db, django_redis):
    queue = RedisFIFO("mail")
    failed_items(queue, 3)
    assert run("requeue-failed", "--queue", "mail", "--backend", "redis") == (
        "redis queue mail: 3 failed item(s) requeued\n"
    )
    assert queue.length("main") == 3
    queue.requeue(*queue.claim(3))
    with time_machine.travel(datetime.now(UTC) + timedelta(hours=2)):
        output = run("remove-failed", "--queue", "mail", "--backend", "redis", "--older-than", "3600")
    assert output == "redis queue mail: 3 failed item(s) removed\n"
    assert queue.length("failed") == 0


def test_requeue_failed_filters_by_fail_count(db):
    queue = DatabaseFIFO("commands")
    failed_items(queue, 2)
    run("requeue-failed", "--max-fail-count", "0")
    assert queue.length("failed") == 2


def test_a_long_run_draws_a_progress_bar_on_a_terminal(db):
    failed_items(DatabaseFIFO("commands"), 1500)
    output = run("remove-failed", stdout=Terminal())
    assert "\rcommands: remove failed [####################..........] 1000/1500" in output
    assert "\rcommands: remove failed [##############################] 1500/1500\n" in output
    assert output.endswith("database queue commands: 1500 failed item(s) removed\n")


def test_a_long_run_in_cron_draws_no_progress_bar(db):
    failed_items(DatabaseFIFO("commands"), 1500)
    assert run("remove-failed") == "database queue commands: 1500 failed item(s) removed\n"


def test_flush_without_yes_and_without_a_terminal_refuses(db, monkeypatch):
    DatabaseFIFO("commands").enqueue("a")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(CommandError, match="pass --yes"):
        run("flush", "--queue", "commands")
    assert DatabaseFIFO("commands").length() == 1


def test_flush_asks_for_confirmation_on_a_terminal(db, monkeypatch):
    DatabaseFIFO("commands").enqueue("a", "b")
    monkeypatch.setattr("sys.stdin", Terminal())
    prompts = []
    monkeypatch.setattr("builtins.input", lambda prompt: prompts.append(prompt) or "no")
    with pytest.raises(CommandError, match="Not flushed"):
        run("flush", "--queue", "commands")
    assert prompts == ["Delete all 2 item(s) of database queue 'commands'? Type 'yes': "]
    monkeypatch.setattr("builtins.input", lambda prompt: "yes")
    assert run("flush", "--queue", "commands") == "database queue commands: 2 item(s) flushed\n"


def test_flush_with_yes_does_not_ask(db):
    DatabaseFIFO("commands").enqueue("a")
    assert run("flush", "--queue", "commands", "--yes") == "database queue commands: 1 item(s) flushed\n"
    assert DatabaseFIFO("commands").length() == 0


def test_flush_needs_a_queue_name(db):
    with pytest.raises(CommandError):
        run("flush", "--yes")


def test_a_bad_queue_name_is_refused(db):
    with pytest.raises(CommandError, match="is not a queue name"):
        run("stats", "--queue", "a b")
