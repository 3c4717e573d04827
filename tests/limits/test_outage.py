"""Redis outages: the budget is a hard per-call limit, the fleet store falls back and comes back.

Two kinds of outage, both real: a private ``redis-server`` that the test kills (connections are
refused at once) and a socket that accepts connections and never answers (every call must give up
by itself). The shared Redis is never touched.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import socket
import statistics
import threading
import time

import pytest
from django.test import override_settings
from prometheus_client import REGISTRY

from limits.admission import admit
from limits.gcra import Limit
from limits.models import Tenant
from limits.store import Charge, Claim, Error, FleetStore, LocalStore, Ok, RedisStore, build_store
from limits.store.redis import HIT_SCRIPT

HIT_SHA = hashlib.sha1(HIT_SCRIPT.encode()).hexdigest()

pytestmark = pytest.mark.machine  # timed to a few milliseconds: make test runs it alone

BUDGET_MS = 50
SLACK_MS = 5  # the bound: every call returns within timeout_ms + 5 ms
# On this shared 2-core machine the scheduler alone sometimes wakes a thread late (seen: +5.7 ms
# with the load average at 6, and once +20 ms during a full CI run beside other test runs). A
# store that ignored its budget would take at least 2× it (connect + read) or redis-py's 2 s, so:
# nine calls in ten within the bound and no call reaching twice the budget.
SCHEDULER_OUTLIER_MS = BUDGET_MS - 5
LIMIT = Limit(rate=1, burst=1000)  # each hit adds a second of debt: the bucket key lives


def charges(tenant="acme"):
    return [Charge("hooks", tenant, LIMIT.increment_us, LIMIT.capacity_us)]


def claim(key="evt"):
    return Claim("acme", "src", key, "cmd", "tok", ttl_ms=60_000, pending_ttl_ms=5_000)


def assert_within_budget(durations: list[float]) -> None:
    assert all(BUDGET_MS - 2 <= ms <= BUDGET_MS + SCHEDULER_OUTLIER_MS for ms in durations), durations
    assert sum(ms <= BUDGET_MS + SLACK_MS for ms in durations) >= int(0.9 * len(durations)), durations


def timed(call) -> tuple[object, float]:
    started = time.perf_counter()
    answer = call()
    return answer, (time.perf_counter() - started) * 1000


@pytest.fixture
def no_gc():
    """A collection pause is not the store's time: keep it out of the measured calls."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


class BreakerClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fleet_store(url, clock, timeout_ms=BUDGET_MS):
    return FleetStore(
        RedisStore(url, timeout_ms=timeout_ms), LocalStore(), threshold=3, cooldown_ms=2000, clock=clock
    )


@pytest.mark.slow
def test_a_silent_redis_costs_each_call_its_budget_and_no_more(silent_socket, no_gc):
    store = RedisStore(silent_socket, timeout_ms=BUDGET_MS)
    calls = [
        lambda: store.hit(charges(), claim()),
        lambda: store.settle(claim(), True),
        lambda: store.reset("acme"),
        lambda: store.ping(),
    ]
    durations = []
    for call in calls * 5:
        answer, ms = timed(call)
        assert answer == Error(f"timeout: no answer within {BUDGET_MS} ms")
        durations.append(ms)
    assert_within_budget(durations)


def test_a_stopped_redis_is_an_error_at_once(private_redis, no_gc):
    store = RedisStore(private_redis.url, timeout_ms=BUDGET_MS)
    assert isinstance(store.hit(charges()), Ok)
    private_redis.stop()
    for _ in range(10):
        answer, ms = timed(lambda: store.hit(charges()))
        assert isinstance(answer, Error)
        assert answer.reason.startswith("unreachable: ")
        assert ms <= BUDGET_MS + SCHEDULER_OUTLIER_MS


def test_building_a_fleet_store_connects_to_nothing(silent_socket):
    with override_settings(ANKUSA_STORE_SCOPE="fleet", REDIS_URL=silent_socket):
        store, ms = timed(build_store)
    assert isinstance(store, FleetStore)
    assert ms < 10


@pytest.mark.slow
def test_the_fleet_store_falls_back_opens_its_breaker_and_closes_it_when_redis_returns(
    private_redis, caplog, no_gc
):
    clock = BreakerClock()
    store = fleet_store(private_redis.url, clock)
    assert isinstance(store.hit(charges(), claim("before")), Ok)
    assert private_redis.client().exists("ankusa:{acme}:hooks") == 1

    fallbacks_before = REGISTRY.get_sample_value("ankusa_fleet_fallbacks_total") or 0
    private_redis.stop()
    with caplog.at_level(logging.INFO, logger="ankusa.limits.fleet"):
        for _ in range(20):
            answer, ms = timed(lambda: store.hit(charges()))
            assert isinstance(answer, Ok)
            assert ms <= BUDGET_MS + SCHEDULER_OUTLIER_MS
        assert store.stats() == {"breaker": "open", "consecutive_failures": 3, "fallbacks": 20}
        assert REGISTRY.get_sample_value("ankusa_fleet_fallbacks_total") == fallbacks_before + 20
        assert REGISTRY.get_sample_value("ankusa_fleet_breaker_open") == 1

        private_redis.start()
        clock.now += 1.999
        assert isinstance(store.hit(charges()), Ok)
        assert private_redis.client().exists("ankusa:{acme}:hooks") == 0  # still answered locally
        clock.now += 0.001
        assert isinstance(store.hit(charges()), Ok)
        assert private_redis.client().exists("ankusa:{acme}:hooks") == 1  # the probe went to Redis
        assert store.stats()["breaker"] == "closed"
        assert REGISTRY.get_sample_value("ankusa_fleet_breaker_open") == 0
        assert isinstance(store.hit(charges()), Ok)

    switches = [(record.levelname, record.getMessage(), record.fields) for record in caplog.records]
    assert switches == [
        (
            "WARNING",
            "fleet_store_failing",
            {
                "reason": "unreachable: ConnectionRefusedError: [Errno 111] Connection refused",
                "probe_every_ms": 2000,
            },
        ),
        ("INFO", "fleet_store_recovered", {"answered_locally_so_far": 21}),
    ]


@pytest.mark.slow
def test_with_a_silent_redis_the_breaker_stops_paying_the_timeout(silent_socket, no_gc):
    clock = BreakerClock()
    store = fleet_store(silent_socket, clock)
    durations = []
    for _ in range(50):
        answer, ms = timed(lambda: store.hit(charges()))
        assert isinstance(answer, Ok)
        durations.append(ms)
    assert_within_budget(durations[:3])
    # Open: no call waits on Redis. Typically ~0.05 ms; the bound leaves room for a busy machine's
    # scheduler while staying far below the 50 ms a call to Redis would cost.
    assert statistics.median(durations[3:]) < 1.0
    assert max(durations[3:]) < BUDGET_MS / 5
    clock.now += 2.0  # the cooldown is over: exactly one call probes Redis again
    answer, ms = timed(lambda: store.hit(charges()))
    assert isinstance(answer, Ok)
    assert BUDGET_MS - 2 <= ms <= BUDGET_MS + SCHEDULER_OUTLIER_MS
    assert timed(lambda: store.hit(charges()))[1] < BUDGET_MS / 5


@pytest.mark.django_db
def test_the_site_keeps_admitting_from_local_state_while_redis_is_silent(silent_socket):
    tenant = Tenant.objects.create(slug="acme", name="Acme", hooks_rate=1, hooks_burst=5)
    with override_settings(ANKUSA_STORE_SCOPE="fleet", REDIS_URL=silent_socket, ANKUSA_STORE_TIMEOUT_MS=20):
        results = [type(admit(tenant, 10).result).__name__ for _ in range(7)]
    assert results == ["Ok"] * 5 + ["RateLimited"] * 2


def test_a_claim_taken_during_the_outage_is_settled_where_it_lives(silent_socket):
    store = fleet_store(silent_socket, BreakerClock(), timeout_ms=10)
    assert isinstance(store.hit(charges(), claim()), Ok)
    assert store.settle(claim(), committed=True) is True
    assert (
        store.hit(charges(), Claim("acme", "src", "evt", "cmd2", "tok2", 60_000, 5_000)).command_id == "cmd"
    )


def test_the_first_call_after_a_script_flush_sends_the_script_again(private_redis):
    store = RedisStore(private_redis.url, timeout_ms=1000)
    assert isinstance(store.hit(charges()), Ok)
    private_redis.client().script_flush()
    assert isinstance(store.hit(charges()), Ok)
    assert private_redis.client().script_exists(__import__("limits.store.redis").store.redis._HIT.sha) == [
        True
    ]


def test_a_password_protected_redis_is_reached_with_the_urls_password(start_private_redis):
    server = start_private_redis(password="s3cret")
    assert isinstance(RedisStore(server.url, timeout_ms=1000).hit(charges()), Ok)
    wrong = RedisStore(server.url.replace("s3cret", "wrong"), timeout_ms=1000).hit(charges())
    assert isinstance(wrong, Error)
    assert wrong.reason.startswith("unreachable: ConnectionError: handshake refused: WRONGPASS")


def test_a_server_that_does_not_speak_redis_is_an_error_not_an_exception():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def answer_garbage():
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer_garbage)
        thread.start()
        answer = RedisStore(f"redis://127.0.0.1:{server.getsockname()[1]}/0", timeout_ms=1000).hit(charges())
        thread.join()
    assert isinstance(answer, Error)
    assert answer.reason.startswith("unreachable: ProtocolError")
