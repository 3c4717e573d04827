"""The switch that turns an unreachable service from a skip (laptop) into a failure (CI)."""

import pytest
from _pytest.outcomes import Failed, Skipped

from tests.services import require_service, tcp_reachable


def test_an_unreachable_service_skips_with_the_reason(monkeypatch):
    monkeypatch.delenv("ANKUSA_REQUIRE_SERVICES", raising=False)
    with pytest.raises(Skipped, match="Redis is not reachable: connection refused"):
        require_service("Redis", "connection refused")


def test_an_unreachable_service_fails_when_ci_requires_services(monkeypatch):
    monkeypatch.setenv("ANKUSA_REQUIRE_SERVICES", "1")
    with pytest.raises(
        Failed, match="Redis is not reachable: connection refused .*turns this skip into a failure"
    ):
        require_service("Redis", "connection refused")


def test_tcp_probe_reports_a_refused_port():
    assert "127.0.0.1:1" in tcp_reachable("redis://127.0.0.1:1/0", 6379)


def test_redis_fixture_gives_an_empty_database_of_its_own(redis_client, settings):
    assert redis_client.connection_pool.connection_kwargs["db"] == settings.TEST_REDIS_DB
    assert redis_client.dbsize() == 0
    redis_client.set("left-behind", 1)


def test_redis_fixture_flushes_what_the_last_test_left(redis_client):
    assert redis_client.get("left-behind") is None


def test_django_redis_uses_the_test_database(django_redis, settings):
    assert django_redis.connection_pool.connection_kwargs["db"] == settings.TEST_REDIS_DB
