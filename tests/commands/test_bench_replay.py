"""``bench/replay.py``, the benchmarks' what-if: the intake's round trips answered in the process
from a recording. Held against the real intake, Redis and PostgreSQL, so that a what-if figure
cannot quietly measure the real round trips instead."""

from __future__ import annotations

import pytest
from django.db import connection

from bench import replay
from bench.replay import replaying
from commands.models import Delivery
from limits.store import forget_store, settling

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def fleet(settings, redis_client, monkeypatch):
    """The fleet store on the tests' Redis, its settles riding on the next claim (no settler thread
    sending them on its own, so each call's shape is known)."""
    settings.ANKUSA_STORE_SCOPE = "fleet"
    forget_store()
    monkeypatch.setattr(settling, "RETRIER", settling.SettleRetrier(background=False))
    monkeypatch.setattr(replay, "_answers", {})  # nothing recorded by another test
    yield
    forget_store()


def claims(redis_client) -> int:
    return len(redis_client.keys("ankusa:{acme}:claim:*"))


def test_a_replayed_store_call_reaches_no_redis_once_its_kind_was_recorded(
    hook_source, post_hook, fleet, redis_client
):
    with replaying(["store"]):
        assert post_hook(delivery="evt-1").status_code == 202  # a claim alone: recorded
        assert post_hook(delivery="evt-2").status_code == 202  # the first's settle, then its claim
        assert claims(redis_client) == 2
        assert post_hook(delivery="evt-3").status_code == 202  # the same kind of call: replayed
        assert claims(redis_client) == 2
    assert Delivery.objects.count() == 3  # the statements were real
    assert post_hook(delivery="evt-4").status_code == 202  # undone on the way out
    assert claims(redis_client) == 3


def test_a_replayed_statement_stores_nothing_and_names_the_recorded_delivery(hook_source, post_hook, fleet):
    if connection.vendor != "postgresql":
        pytest.skip("the intake's one statement is PostgreSQL's")
    with replaying(["statement"]):
        first = post_hook(delivery="evt-1")
        second = post_hook(delivery="evt-2")
    assert first.status_code == second.status_code == 202
    assert second.json()["id"] == first.json()["id"]
    assert Delivery.objects.count() == 1
    third = post_hook(delivery="evt-3")
    assert third.json()["id"] != first.json()["id"]
    assert Delivery.objects.count() == 2


def test_a_wait_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match="no such wait: redis"):
        with replaying(["redis"]):
            pass
