"""``manage.py queues``: a number of seconds or a fail count it cannot use is an error naming the
option, before any queue is touched — with ``--queue`` or without (every known queue, none at all)."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from queues.backends.database import DatabaseFIFO


def run(*args) -> str:
    out = io.StringIO()
    call_command("queues", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def failed_item(queue) -> None:
    queue.requeue_limit = 0
    queue.enqueue("a")
    queue.requeue(*queue.claim(1))


SECONDS_OPTIONS = [
    ("requeue-failed", "--delay"),
    ("remove-failed", "--older-than"),
    ("recover", "--older-than"),
]


@pytest.mark.parametrize(("action", "option"), SECONDS_OPTIONS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e308", "-1", "soon"])
@pytest.mark.parametrize("queue", [["--queue", "fzq"], []])
def test_seconds_that_are_not_a_usable_duration_are_an_error_naming_the_option(
    db, action, option, value, queue
):
    failed_item(DatabaseFIFO("fzq"))
    with pytest.raises(CommandError) as refused:
        run(action, *queue, f"{option}={value}")  # with "=", "-inf" reaches the type, not the parser
    assert str(refused.value) == (
        f"Error: argument {option}: {value!r} is not a number of seconds from 0 to 864,000,000"
    )
    assert DatabaseFIFO("fzq").length("failed") == 1


def test_recover_with_action_fail_refuses_nan_before_touching_the_queue(db):
    with pytest.raises(CommandError, match="argument --older-than: 'nan' is not a number of seconds"):
        run("recover", "--queue", "fzq", "--older-than", "nan", "--action", "fail")


@pytest.mark.parametrize("value", ["-1", str(2**31), "1e3"])
def test_a_fail_count_out_of_range_is_an_error_naming_the_option(db, value):
    with pytest.raises(CommandError) as refused:
        run("requeue-failed", "--queue", "fzq", "--max-fail-count", value)
    assert str(refused.value) == (
        f"Error: argument --max-fail-count: {value!r} is not a whole number from 0 to 2,147,483,647"
    )


def test_the_largest_accepted_values_work_on_every_known_queue(db):
    failed_item(DatabaseFIFO("fzq"))
    assert run("remove-failed", "--older-than", "864000000") == ""  # failed just now: kept
    assert run("requeue-failed", "--delay", "0", "--max-fail-count", "2147483647") == (
        "database queue fzq: 1 failed item(s) requeued\n"
    )
