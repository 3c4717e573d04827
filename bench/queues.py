"""Benchmark of the reliable FIFO (run by hand, not by the test suite).

    .venv/bin/python bench/queues.py [--quick]

Measures, in one run and against baselines measured in the same run:

* Redis claim+done throughput at batch 100, against a reference implementation of the seed's
  original list design (``LPUSH`` / pipelined ``RPOPLPUSH`` into a busy list / ``LREM`` on done);
* Redis done rate with 100,000 items parked in busy, against the rate with none (the list design
  scans the busy list on every done; the sorted set does not);
* Redis single-item claim+done cycles, and single-item enqueues (intake's, one a webhook), against
  raw ``PING`` round trips: per second, and per second of the client's CPU;
* PostgreSQL (when ``DATABASE_URL`` names it) time of a batch-100 claim with 1,000,000 items
  queued (100,000 with ``--quick``) against the time with 1,000;
* PostgreSQL enqueue commits/s from 8 threads while no consumer sleeps (no ``NOTIFY``) against
  while one sleeps (every commit notifies: the wake gate of ``queues.0004``);
* PostgreSQL drain rate of a sudden 20,000-item backlog by a consumer whose plans were made on an
  empty queue against a new session;
* exactly-once: 4 processes x 4 threads drain 20,000 items on Redis and on the database.

Prints a table and ends with one JSON line. Redis: only keys under this run's own unique names
(``bench-<pid>-<random>``) on ``REDIS_URL``, deleted at the end. Database: a throw-away database
(``bench_queues_<pid>``, created and destroyed like Django's test database), never the site's.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret-" + "x" * 32)

import django  # noqa: E402
import psycopg  # noqa: E402

django.setup()

from django.db import DEFAULT_DB_ALIAS, connection, connections  # noqa: E402
from django_redis import get_redis_connection  # noqa: E402

from queues.backends.database import DatabaseFIFO  # noqa: E402
from queues.backends.redis import REGISTRY_KEY, RedisFIFO  # noqa: E402
from tests.services import database_url  # noqa: E402

TAG = f"bench-{os.getpid()}-{secrets.token_hex(3)}"


class ListFIFO:
    """The seed's original Redis design, as a baseline: items are serialized records pushed on a
    list, claimed one ``RPOPLPUSH`` each into a busy list (pipelined for a batch) and finished
    with ``LREM busy -1 <record>``, which scans the busy list from its tail."""

    def __init__(self, client, name: str):
        self.redis, self.main, self.busy = client, f"{name}:main", f"{name}:busy"

    def enqueue(self, *payloads) -> None:
        with self.redis.pipeline(transaction=False) as pipe:
            for payload in payloads:
                record = {"id": uuid.uuid4().hex, "t": time.time(), "rc": 0, "p": payload}
                pipe.lpush(self.main, json.dumps(record, separators=(",", ":")))
            pipe.execute()

    def claim(self, n: int = 1) -> list[tuple[bytes, dict]]:
        with self.redis.pipeline(transaction=False) as pipe:
            for _ in range(n):
                pipe.rpoplpush(self.main, self.busy)
            return [(raw, json.loads(raw)) for raw in pipe.execute() if raw is not None]

    def done(self, *items: tuple[bytes, dict]) -> None:
        with self.redis.pipeline(transaction=False) as pipe:
            for raw, _ in items:
                pipe.lrem(self.busy, -1, raw)
            pipe.execute()

    def delete(self) -> None:
        self.redis.delete(self.main, self.busy)


def fill(queue, count: int, chunk: int = 1000) -> None:
    for start in range(0, count, chunk):
        queue.enqueue(*({"n": n, "body": "x" * 64} for n in range(start, min(count, start + chunk))))


def best(rounds: int, *measures):
    """Best rate of each measure over ``rounds`` interleaved rounds: this machine is shared, so
    a round that another process slowed down says nothing about the code."""
    results = [[measure() for measure in measures] for _ in range(rounds)]
    return [max(column) for column in zip(*results, strict=True)]


def drain_rate(queue, items: int, batch: int) -> float:
    """Items per second of claim(batch) + done over ``items`` freshly queued items."""
    fill(queue, items)
    handled, started = 0, time.perf_counter()
    while claimed := queue.claim(batch):
        queue.done(*claimed)
        handled += len(claimed)
    return handled / (time.perf_counter() - started)


def done_rate(queue, items: int, batch: int = 100) -> float:
    """Items per second of done alone, for ``items`` freshly claimed items in batches."""
    fill(queue, items)
    spent = 0.0
    while claimed := queue.claim(batch):
        started = time.perf_counter()
        queue.done(*claimed)
        spent += time.perf_counter() - started
    return items / spent


def park(queue, count: int) -> None:
    """``count`` items claimed and never finished: a busy list/set of that size."""
    fill(queue, count)
    while queue.claim(1000):
        pass


def cycle_rate(queue, cycles: int, one_script: bool) -> float:
    """Single-item claim + done cycles per second: two scripts, or done and the next claim in one."""
    fill(queue, cycles + 1)
    started = time.perf_counter()
    if one_script:
        items = queue.claim()
        for _ in range(cycles):
            items = queue.done_and_claim(*items)
        queue.done(*items)
    else:
        for _ in range(cycles):
            queue.done(*queue.claim())
    return cycles / (time.perf_counter() - started)


def enqueue_rate(queue, count: int, clock=time.perf_counter) -> float:
    """Single-item enqueues per second, as intake makes them on the Redis queue (one a webhook); per
    second of this process's CPU with ``clock=time.process_time``."""
    started = clock()
    for n in range(count):
        queue.enqueue({"command": n, "attempt": 1})
    return count / (clock() - started)


def ping_rate(client, count: int, clock=time.perf_counter) -> float:
    started = clock()
    for _ in range(count):
        client.ping()
    return count / (clock() - started)


def bench_redis(client, quick: bool) -> dict:
    rounds = 4 if quick else 10
    items = 2_000 if quick else 3_000
    ours, ref = RedisFIFO(f"{TAG}-b100", client=client), ListFIFO(client, f"{TAG}-ref-b100")
    ours_b100, ref_b100 = best(
        rounds, lambda: drain_rate(ours, items, 100), lambda: drain_rate(ref, items, 100)
    )

    parked = 100_000
    idle, loaded = RedisFIFO(f"{TAG}-done0", client=client), RedisFIFO(f"{TAG}-done100k", client=client)
    park(loaded, parked)
    done_idle, done_loaded = best(rounds, lambda: done_rate(idle, items), lambda: done_rate(loaded, items))
    # The list design at 100k busy scans the whole list on each done (about a millisecond of
    # Redis each): a small sample in batches of 10, so no pipeline holds a shared Redis for long.
    sample = 100 if quick else 300
    ref_idle, ref_loaded = ListFIFO(client, f"{TAG}-ref-done0"), ListFIFO(client, f"{TAG}-ref-done100k")
    park(ref_loaded, parked)
    ref_done_idle, ref_done_loaded = best(
        1, lambda: done_rate(ref_idle, sample, batch=10), lambda: done_rate(ref_loaded, sample, batch=10)
    )

    # Round trips feel the neighbours most: many short rounds, so some land in a quiet moment.
    cycles = 500 if quick else 1_000
    single = RedisFIFO(f"{TAG}-single", client=client)
    enqueued = RedisFIFO(f"{TAG}-enqueue", client=client)
    one, two, enqueue, ping, enqueue_cpu, ping_cpu = best(
        2 * rounds,
        lambda: cycle_rate(single, cycles, one_script=True),
        lambda: cycle_rate(single, cycles, one_script=False),
        lambda: enqueue_rate(enqueued, cycles),
        lambda: ping_rate(client, cycles),
        # What intake's worker pays: the client's CPU, which the round trip's wait hides above.
        lambda: enqueue_rate(enqueued, cycles, time.process_time),
        lambda: ping_rate(client, cycles, time.process_time),
    )
    return {
        "ours_b100": ours_b100,
        "ref_b100": ref_b100,
        "done_idle": done_idle,
        "done_loaded": done_loaded,
        "ref_done_idle": ref_done_idle,
        "ref_done_loaded": ref_done_loaded,
        "single_one_script": one,
        "single_two_scripts": two,
        "enqueue": enqueue,
        "ping": ping,
        "enqueue_cpu": enqueue_cpu,
        "ping_cpu": ping_cpu,
    }


def cleanup_redis(client) -> None:
    keys = list(client.scan_iter(match=f"ankusa:queue:{{{TAG}*", count=1000))
    keys += list(client.scan_iter(match=f"{TAG}*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    for name in client.smembers(REGISTRY_KEY):
        if name.decode().startswith(TAG):
            client.srem(REGISTRY_KEY, name)


def insert_main(queue: DatabaseFIFO, first: int, last: int) -> None:
    """Items ``first`` to ``last`` straight into ``queue``'s main, in one statement (a backlog)."""
    with connections[queue.using].cursor() as cursor:
        cursor.execute(
            "INSERT INTO queues_queueitem (queue, state, position, payload, enqueued_at, claims, "
            "requeue_count, fail_count, last_error) SELECT %s, 'main', g, "
            "jsonb_build_object('n', g, 'body', repeat('x', 64)), now(), 0, 0, 0, '' "
            "FROM generate_series(%s, %s) AS g",
            [queue.name, first, last],
        )


class HeldQueue:
    """A database queue held at its size while claims are timed: each timed claim(100) is
    finished and replaced by 100 new items (untimed)."""

    def __init__(self, using: str, size: int):
        self.queue = DatabaseFIFO(f"{TAG}-pg", using=using)
        self.last = 0
        self.add(size)
        with connections[using].cursor() as cursor:
            # Statistics for the planner, and the WAL of the bulk insert written out now, so the
            # checkpoint it would trigger does not land in the middle of the timed claims.
            cursor.execute("VACUUM ANALYZE queues_queueitem")
            cursor.execute("CHECKPOINT")

    def add(self, count: int) -> None:
        insert_main(self.queue, self.last + 1, self.last + count)
        self.last += count

    def claim_time(self) -> float:
        started = time.perf_counter()
        items = self.queue.claim(100)
        spent = time.perf_counter() - started
        assert len(items) == 100
        self.queue.done(*items)
        self.add(100)
        return spent


def bench_postgres(quick: bool) -> dict | None:
    """claim(100) with 1,000 items queued against 1,000,000 (100,000 with ``--quick``), each queue
    alone in a database of its own, timed alternately so the machine's load drifts touch both
    alike; the lower quartile of 60 claims each, after 5 warm-up claims."""
    if connection.vendor != "postgresql":
        return None
    big = 100_000 if quick else 1_000_000
    small_db = f"{connection.settings_dict['NAME']}_small"
    connection.close()  # a template database must have no sessions
    with connection._nodb_cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{small_db}" TEMPLATE "{connection.settings_dict["NAME"]}"')
    connections.settings["small"] = {**connection.settings_dict, "NAME": small_db}
    try:
        small, large = HeldQueue("small", 1_000), HeldQueue(DEFAULT_DB_ALIAS, big)
        times: dict[str, list[float]] = {"small": [], "large": []}
        for round_ in range(65):
            for label, held in (("small", small), ("large", large)):
                spent = held.claim_time()
                if round_ >= 5:
                    times[label].append(spent)
    finally:
        connections["small"].close()
        with connection._nodb_cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{small_db}"')
    # The lower quartile: on a shared machine the slow claims measure the neighbours.
    small_s, large_s = (statistics.quantiles(times[label], n=4)[0] for label in ("small", "large"))
    return {"queued_small": 1_000, "queued_large": big, "claim_small_s": small_s, "claim_large_s": large_s}


def enqueue_commits(seconds: float, threads: int = 8) -> float:
    """Single-item enqueues, each its own commit, from ``threads`` threads for ``seconds``: per s."""
    queue = DatabaseFIFO(f"{TAG}-wake")
    counts = [0] * threads
    deadline = time.monotonic() + seconds

    def run(slot: int) -> None:
        try:
            while time.monotonic() < deadline:
                queue.enqueue({"n": slot})
                counts[slot] += 1
        finally:
            connection.close()

    workers = [threading.Thread(target=run, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / seconds


def bench_wake_gate(quick: bool) -> dict | None:
    """PostgreSQL: enqueue commits/s while a consumer sleeps (each commit sends ``NOTIFY``, whose
    lock makes the commits take turns) against while none does (migration ``queues.0004``: no
    ``NOTIFY``), in alternating rounds; the best round of each."""
    if connection.vendor != "postgresql":
        return None
    sleeper = psycopg.connect(database_url(connection.settings_dict), autocommit=True)
    rounds, seconds = (2, 1.0) if quick else (4, 3.0)
    rates: dict[str, list[float]] = {"sleeping": [], "nobody": []}
    try:
        for _ in range(rounds):
            sleeper.execute("SELECT queues_wake_sleep(%s)", [f"{TAG}-other"])  # another queue: no look hit
            rates["sleeping"].append(enqueue_commits(seconds))
            sleeper.execute("SELECT queues_wake_rise()")
            rates["nobody"].append(enqueue_commits(seconds))
    finally:
        sleeper.close()
    return {label: max(found) for label, found in rates.items()}


def backlog_rate(queue: DatabaseFIFO, items: int, *, warm: bool) -> float:
    """Items/s draining a backlog of ``items`` (claim and done, 100 at a time) that arrives at once,
    after (``warm``) a dozen single-item cycles on the empty queue have made its statements'
    plans."""
    if warm:
        for n in range(12):
            queue.enqueue({"n": n})
            queue.done(*queue.claim(1))
    insert_main(queue, 1, items)
    started, drained = time.perf_counter(), 0
    while found := queue.claim(100):
        drained += queue.done(*found)
    return drained / (time.perf_counter() - started)


def bench_backlog(quick: bool) -> dict | None:
    """PostgreSQL: a sudden backlog drained by a consumer whose statements' plans were made on an
    empty queue, against by a new session, which plans for the table as it is."""
    if connection.vendor != "postgresql":
        return None
    items = 5_000 if quick else 20_000
    with connection.cursor() as cursor:
        # Empty, as a quiet site's is (the parts before left rows in this throw-away database).
        cursor.execute("TRUNCATE queues_queueitem")
        cursor.execute("ANALYZE queues_queueitem")
    rates = {"consumer": backlog_rate(DatabaseFIFO(f"{TAG}-consumer"), items, warm=True)}
    connection.close()
    rates["new_session"] = backlog_rate(DatabaseFIFO(f"{TAG}-new"), items, warm=False)
    return {"items": items, **rates}


def exactly_once(backend: str, items: int = 20_000) -> bool:
    name = f"{TAG}-once-{backend}"
    queue = RedisFIFO(name) if backend == "redis" else DatabaseFIFO(name)
    fill(queue, items, chunk=5000)
    env = dict(os.environ, DATABASE_URL=database_url(connection.settings_dict), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "tests.queues.drain", backend, name, "1", "7", "25", "100"]
    workers = [
        subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for _ in range(4)
    ]
    for worker in workers:
        worker.stdout.readline()
    for worker in workers:
        worker.stdin.write("go\n")
        worker.stdin.flush()
    claimed = Counter()
    for worker in workers:
        out, _ = worker.communicate(timeout=600)
        claimed.update(pk for ids in json.loads(out.strip().splitlines()[-1]) for pk in ids)
    empty = sum(queue.length(kind) for kind in ("main", "busy", "failed")) == 0
    return empty and len(claimed) == items and set(claimed.values()) == {1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="Smaller sizes (100,000 rows for PostgreSQL).")
    parser.add_argument("--only", choices=["redis", "postgres", "once"], help="Run one part only.")
    args = parser.parse_args()

    db = connection.settings_dict
    bench_name = f"bench_queues_{os.getpid()}"
    if db["ENGINE"].endswith("sqlite3"):
        bench_name = str(Path(db["NAME"]).with_name(f"{bench_name}.sqlite3"))
    db["TEST"]["NAME"] = bench_name
    real_name = db["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    client = get_redis_connection("redis")
    try:
        redis_figures = bench_redis(client, args.quick) if args.only in (None, "redis") else None
        pg = bench_postgres(args.quick) if args.only in (None, "postgres") else None
        gate = bench_wake_gate(args.quick) if args.only in (None, "postgres") else None
        backlog = bench_backlog(args.quick) if args.only in (None, "postgres") else None
        once = {}
        if args.only in (None, "once"):
            once = {"redis": exactly_once("redis"), connection.vendor: exactly_once("database")}
    finally:
        cleanup_redis(client)
        connection.creation.destroy_test_db(real_name, verbosity=0)

    report(redis_figures, pg, gate, backlog, once, quick=args.quick)


def report(
    r: dict | None,
    pg: dict | None,
    gate: dict | None,
    backlog: dict | None,
    once: dict[str, bool],
    *,
    quick: bool,
) -> None:
    def ratio(a: str, b: str) -> float | None:
        return None if r is None else round(r[a] / r[b], 3)

    print(f"{'measure':<52} {'ankusa':>12} {'baseline':>12} {'ratio':>7}")
    rows = (
        []
        if r is None
        else [
            ("Redis claim+done, batch 100 (items/s)", "ours_b100", "ref_b100"),
            ("Redis done, busy empty (items/s)", "done_idle", "ref_done_idle"),
            ("Redis done, 100,000 parked in busy (items/s)", "done_loaded", "ref_done_loaded"),
            ("Redis single cycle, done+claim in one script (/s)", "single_one_script", "ping"),
            ("Redis single cycle, claim then done (/s)", "single_two_scripts", "ping"),
            ("Redis single-item enqueue (/s)", "enqueue", "ping"),
            ("Redis single-item enqueue (/s of client CPU)", "enqueue_cpu", "ping_cpu"),
        ]
    )
    for label, ours, base in rows:
        print(f"{label:<52} {r[ours]:>12,.0f} {r[base]:>12,.0f} {r[ours] / r[base]:>7.2f}")
    if pg:
        label = f"PostgreSQL claim(100), {pg['queued_large']:,} vs 1,000 queued (ms)"
        large, small = pg["claim_large_s"] * 1000, pg["claim_small_s"] * 1000
        print(f"{label:<52} {large:>12.2f} {small:>12.2f} {large / small:>7.2f}")
    if gate:
        label = "PostgreSQL enqueue commits/s, nobody vs one sleeping"
        print(
            f"{label:<52} {gate['nobody']:>12,.0f} {gate['sleeping']:>12,.0f} {gate['nobody'] / gate['sleeping']:>7.2f}"
        )
    if backlog:
        label = f"PostgreSQL {backlog['items']:,} backlog, consumer vs new session"
        print(f"{label:<52} {backlog['consumer']:>12,.0f} {backlog['new_session']:>12,.0f} "
              f"{backlog['consumer'] / backlog['new_session']:>7.2f}")  # fmt: skip
    for backend, ok in once.items():
        print(f"exactly once, 4 processes x 4 threads, 20,000 items, {backend}: {ok}")

    figures = {
        "redis_b100_vs_list_lrem": ratio("ours_b100", "ref_b100"),
        "redis_done_busy100k_vs_busy0": ratio("done_loaded", "done_idle"),
        "list_done_busy100k_vs_busy0": ratio("ref_done_loaded", "ref_done_idle"),
        "redis_single_vs_ping": ratio("single_one_script", "ping"),
        "redis_single_two_calls_vs_ping": ratio("single_two_scripts", "ping"),
        "redis_enqueue_vs_ping": ratio("enqueue", "ping"),
        "redis_enqueue_vs_ping_cpu": ratio("enqueue_cpu", "ping_cpu"),
        "pg_claim_1m_vs_1k": None if pg is None else round(pg["claim_large_s"] / pg["claim_small_s"], 3),
        "pg_queued_large": None if pg is None else pg["queued_large"],
        "pg_enqueue_nobody_sleeps_vs_one_sleeping": None
        if gate is None
        else round(gate["nobody"] / gate["sleeping"], 3),
        "pg_backlog_consumer_vs_new_session": None
        if backlog is None
        else round(backlog["consumer"] / backlog["new_session"], 3),
        "exactly_once": all(once.values()) if once else None,
        "quick": quick,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
