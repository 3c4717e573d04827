"""Under contention, across threads and processes: no overshoot, and one winner per claim."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from django.conf import settings

from limits.store import Claim, Ok, Pending, RedisStore

pytestmark = pytest.mark.slow

PROCESSES, THREADS, HITS = 4, 8, 40
BURST, NEGLIGIBLE_RATE = 50, 0.001  # one more hook every 1000 s: none during the test


def run_workers(service_env, mode: str, processes: int, **args) -> list[list]:
    """Start the processes, wait until every thread of every one is ready, start them together."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.limits.store_worker", mode, json.dumps({**args, "proc": n})],
            cwd=settings.BASE_DIR,
            env=service_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [json.loads(proc.stdout.readline()) for proc in procs]
        for proc in procs:
            assert proc.wait(timeout=60) == 0
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_processes_and_threads_on_redis_admit_exactly_the_burst(redis_client, service_env):
    outputs = run_workers(
        service_env, "hit", PROCESSES, url=settings.REDIS_URL, threads=THREADS, hits=HITS,
        rate=NEGLIGIBLE_RATE, burst=BURST,
    )  # fmt: skip
    assert [len(seen) for seen in outputs] == [THREADS * HITS] * PROCESSES
    assert sum(sum(seen) for seen in outputs) == BURST


def test_the_local_store_admits_exactly_the_burst_in_each_process(service_env):
    outputs = run_workers(
        service_env, "hit", PROCESSES, url="local", threads=THREADS, hits=HITS,
        rate=NEGLIGIBLE_RATE, burst=BURST,
    )  # fmt: skip
    assert [sum(seen) for seen in outputs] == [BURST] * PROCESSES


def claim_round(service_env, key: str) -> tuple[list[tuple], dict]:
    outputs = run_workers(service_env, "claim", 5, url=settings.REDIS_URL, threads=10, key=key)
    answers = [tuple(answer) for seen in outputs for answer in seen]
    assert len(answers) == 50
    counts = {}
    for name, _, _ in answers:
        counts[name] = counts.get(name, 0) + 1
    return answers, counts


def holder_claim(token: str, key: str = "evt_1") -> Claim:
    return Claim("acme", "src", key, f"cmd-{token}", token, ttl_ms=600_000, pending_ttl_ms=30_000)


def test_fifty_concurrent_claims_of_one_key_have_one_winner(redis_client, service_env):
    store = RedisStore(settings.REDIS_URL, timeout_ms=2000)
    answers, counts = claim_round(service_env, "evt_1")
    assert counts == {"Ok": 1, "Pending": 49}
    first = next(token for name, token, _ in answers if name == "Ok")

    assert store.settle(holder_claim(first), committed=False) is True  # released: takeable again
    answers, counts = claim_round(service_env, "evt_1")
    assert counts == {"Ok": 1, "Pending": 49}
    second = next(token for name, token, _ in answers if name == "Ok")

    assert store.settle(holder_claim(second), committed=True) is True
    answers, counts = claim_round(service_env, "evt_1")
    assert counts == {"Duplicate": 50}
    assert {command_id for _, _, command_id in answers} == {f"cmd-{second}"}


def test_a_dead_holders_claim_is_takeable_after_the_pending_ttl(redis_client, service_env):
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.limits.store_worker", "hold",
         json.dumps({"url": settings.REDIS_URL, "key": "evt_dead", "token": "dead"})],
        cwd=settings.BASE_DIR, env=service_env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert json.loads(holder.stdout.readline()) == {"held": "Ok"}
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    seconds, micros = redis_client.time()
    redis_now_us = seconds * 1_000_000 + micros
    claim = holder_claim("alive", "evt_dead")
    now_store = RedisStore(settings.REDIS_URL, timeout_ms=2000, clock=lambda: redis_now_us)
    assert isinstance(now_store.hit([], claim), Pending)
    later = RedisStore(settings.REDIS_URL, timeout_ms=2000, clock=lambda: redis_now_us + 30_000_000)
    assert later.hit([], claim) == Ok(())
