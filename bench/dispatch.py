"""Benchmark: the dispatch loop against raw HTTP, and a kill-and-restart run that counts losses.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python bench/dispatch.py [--quick]

It creates its own throw-away database (Django's test database for ``DATABASE_URL``, dropped at
the end), starts the counting HTTP sink of the tests as a separate process, and measures:

* ``raw_http_per_s`` — POSTs per second that the dispatch loop's own HTTP client (the same aiohttp
  session on the same event loop, ``ANKUSA_DISPATCH_CONCURRENCY`` requests at once, in this same
  process) reaches against the sink: the baseline.
* ``dispatch_per_s`` — commands per second from ``approved`` to ``succeeded`` through one round of
  the loop (``run_round``: recover, sweep, consume; every state change and attempt row written)
  in one process with the same concurrency, against the same sink.
* ``dispatch_vs_raw_http`` = dispatch / raw. Target ≥ 0.5 on PostgreSQL. Both are measured in
  interleaved rounds (5, or 1 with ``--quick``) and each keeps its best: the machine is shared,
  and a round another process slowed down says nothing about the code. ``ratio_per_round``
  lists the ratio of each round's own pair.
* ``lost`` / ``double_sent`` — ``manage.py dispatch`` killed with -9 in the middle of a run on a
  non-idempotent connector, then restarted: commands that did not end ``succeeded`` or ``failed``
  with a reason (or succeeded without reaching the sink), and commands the sink got twice. Both
  must be 0.
* what each fast path buys the loop: the same round in a process of its own, as deployed
  (``fast``) and with ``ANKUSA_STOCK_DJANGO`` at each value of ``--stock`` (by default ``all``,
  then each layer the loop has alone: ``prepared``, ``sql``, ``backend``; with ``--quick``,
  ``all``), alternating, ``--stock-rounds`` times (3; 1 with ``--quick``). ``<v>_buys`` — the
  fast process's best commands/s ÷ the variant's (``stock`` for ``all``, ``stock_<layer>``);
  ``<v>_buys_cpu`` — the variant's CPU per command ÷ the fast one's (the loop's process and
  PostgreSQL's, medians over rounds: steadier than a rate on a shared machine); both above 1
  when the fast path buys anything. ``own_process`` holds each one's figures.

Prints a table, then one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret-" + "x" * 32)
# The sink listens on loopback, which connectors may reach only where an installation opens it.
os.environ.setdefault("ANKUSA_CONNECTOR_ALLOWED_NETWORKS", "127.0.0.0/8")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from ankusa_site.core.stock import parse  # noqa: E402
from bench.intake import stock_option  # noqa: E402
from bench.latency import postmaster_of, server_cpu  # noqa: E402
from commands.dispatch import event_loop  # noqa: E402
from commands.dispatch.adapters import http_async  # noqa: E402
from commands.dispatch.dispatcher import Dispatcher  # noqa: E402
from commands.dispatch.rounds import run_round  # noqa: E402
from commands.lifecycle import commands_queue  # noqa: E402
from commands.models import Command, Connector  # noqa: E402
from commands.states import State  # noqa: E402
from limits.models import Tenant  # noqa: E402
from tests.commands.sink import ReceiverProcess  # noqa: E402
from tests.services import database_url  # noqa: E402

KILL_ENV = {
    "ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S": "2",
    "ANKUSA_HTTP_CONNECT_TIMEOUT_S": "0.5",
    "ANKUSA_HTTP_READ_TIMEOUT_S": "1",
    "ANKUSA_DISPATCH_INTERVAL_S": "0.2",
}


class SinkProcess(ReceiverProcess):
    def __init__(self):
        super().__init__(cwd=BASE_DIR, timeout=5)


def raw_http(url: str, n: int, concurrency: int) -> float:
    """Requests/s of the dispatch loop's HTTP client alone: its aiohttp session on its event loop,
    ``concurrency`` tasks."""
    body = json.dumps({"order": 1, "action": "ship"}).encode()
    counter = iter(range(n))

    async def work() -> None:
        client = http_async.session()
        while (number := next(counter, None)) is not None:
            headers = {"Content-Type": "application/json", "Idempotency-Key": f"raw-{number}"}
            async with client.post(url, data=body, headers=headers) as response:
                await response.read()

    async def all_of_them() -> None:
        await asyncio.gather(*(work() for _ in range(concurrency)))

    started = time.perf_counter()
    event_loop.run(all_of_them())
    return n / (time.perf_counter() - started)


def make_commands(connector: Connector, n: int) -> None:
    Command.objects.bulk_create(
        [
            Command(tenant=connector.tenant, connector=connector, payload={"order": i, "action": "ship"})
            for i in range(n)
        ],
        batch_size=1000,
    )


def through_the_loop(connector: Connector, n: int) -> float:
    """Commands/s from approved to succeeded: one round of the loop (recover, sweep, drain)."""
    make_commands(connector, n)
    # Planner statistics for the rows just made, as autovacuum keeps them on a running system; a
    # fresh table without them gets plans no production database would use.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    # One connector, so the per-connector cap is lifted to the pool size: the same concurrency as raw.
    concurrency = settings.ANKUSA_DISPATCH_CONCURRENCY
    started = time.perf_counter()
    with Dispatcher(per_connector=concurrency) as dispatcher:
        run_round(dispatcher)
    elapsed = time.perf_counter() - started
    done = Command.objects.filter(connector=connector, state=State.SUCCEEDED).count()
    if done != n:
        raise SystemExit(f"only {done} of {n} commands succeeded")
    return n / elapsed


def child_round(n: int, name: str) -> dict:
    """``--child-round``: one round of ``n`` commands in this process (after a warm-up of its own),
    on the database and sink the parent made; its rate, its CPU per command and PostgreSQL's, and
    the stock layers it ran with."""
    tenant = Tenant.objects.get(slug="bench")
    url = os.environ["BENCH_SINK_URL"]
    warm = Connector.objects.create(tenant=tenant, name=f"{name}-warm", kind="http", url=url, idempotent=True)
    through_the_loop(warm, min(300, n))
    speed = Connector.objects.create(tenant=tenant, name=name, kind="http", url=url, idempotent=True)
    postmaster = postmaster_of(connection) if connection.vendor == "postgresql" else None

    def server_seconds() -> float:
        return server_cpu(postmaster) if postmaster else 0.0  # SQLite works in this process

    cpu, server = time.process_time(), server_seconds()
    per_s = through_the_loop(speed, n)
    cpu, server = time.process_time() - cpu, server_seconds() - server
    return {
        "per_s": round(per_s, 1),
        "cpu_ms": {"loop": round(1000 * cpu / n, 3), "postgres": round(1000 * server / n, 3)},
        "layers": sorted(settings.ANKUSA_STOCK_DJANGO),
    }


def in_own_process(env: dict, stock: str, n: int, name: str) -> dict:
    """:func:`child_round` in a new process with ``ANKUSA_STOCK_DJANGO=stock``."""
    result = subprocess.run(
        [sys.executable, __file__, "--child-round", str(n), "--name", name],
        cwd=BASE_DIR,
        env={**env, "ANKUSA_STOCK_DJANGO": stock},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode:
        raise SystemExit(f"the round with ANKUSA_STOCK_DJANGO={stock!r} failed:\n{result.stderr[-3000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    if figures["layers"] != sorted(parse(stock)):  # the child ran what it was asked to
        raise SystemExit(f"ANKUSA_STOCK_DJANGO={stock!r} ran with {figures['layers']}")
    return figures


def stock_variants(env: dict, variants: list[str], rounds: int, n: int) -> dict:
    """The loop as deployed (``fast``) and with each stock variant, each round in a process of its
    own, alternating; the figures of each (best rate, median CPU) and what each fast path buys."""
    if not variants:
        return {}
    names = {"fast": "0", **{("stock" if v == "all" else f"stock_{v}"): v for v in variants}}
    runs: dict[str, list[dict]] = {name: [] for name in names}
    for number in range(rounds):
        for name, stock in names.items():
            runs[name].append(in_own_process(env, stock, n, f"{name}-{number}"))
    own = {
        name: {
            "per_s": max(run["per_s"] for run in found),
            "cpu_ms": {
                kind: round(statistics.median(run["cpu_ms"][kind] for run in found), 3)
                for kind in ("loop", "postgres")
            },
        }
        for name, found in runs.items()
    }
    figures: dict = {"own_process": own}
    fast = own["fast"]
    for name in names:
        if name == "fast":
            continue
        figures[f"{name}_buys"] = round(fast["per_s"] / own[name]["per_s"], 3)
        figures[f"{name}_buys_cpu"] = round(
            sum(own[name]["cpu_ms"].values()) / sum(fast["cpu_ms"].values()), 3
        )
    return figures


def kill_and_restart(sink: SinkProcess, connector: Connector, n: int) -> tuple[int, int, int]:
    """Returns (lost, double_sent, sends in flight when killed)."""
    make_commands(connector, n)
    env = {
        **os.environ,
        **KILL_ENV,
        "DATABASE_URL": database_url(settings.DATABASES["default"]),
        "PYTHONPATH": str(BASE_DIR),
    }
    command = [sys.executable, "manage.py", "dispatch"]
    first = subprocess.Popen(command, cwd=BASE_DIR, env=env, stdout=subprocess.DEVNULL)
    before = sink.stats()["received"]
    deadline = time.monotonic() + 120
    while sink.stats()["received"] - before < n // 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)
    first.wait()
    in_flight = Command.objects.filter(connector=connector, state=State.DISPATCHING).count()
    second = subprocess.Popen(command, cwd=BASE_DIR, env=env, stdout=subprocess.DEVNULL)
    mine = Command.objects.filter(connector=connector)
    queue = commands_queue()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if not mine.exclude(state__in=[State.SUCCEEDED, State.FAILED]).exists() and queue.length("busy") == 0:
            break
        time.sleep(0.1)
    second.send_signal(signal.SIGTERM)
    second.wait(timeout=60)
    keys = sink.stats()["keys"]
    ended = mine.filter(state=State.SUCCEEDED) | mine.filter(state=State.FAILED).exclude(skip_reason="")
    lost = n - ended.count()
    lost += sum(
        1 for pk in mine.filter(state=State.SUCCEEDED).values_list("pk", flat=True) if str(pk) not in keys
    )
    double_sent = sum(1 for pk in mine.values_list("pk", flat=True) if keys.get(str(pk), 0) > 1)
    return lost, double_sent, in_flight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small runs (a smoke test, not a measurement)")
    stock_option(parser, "each round in a process of its own", "prepared, sql and backend alone")
    parser.add_argument(
        "--stock-rounds", type=int, default=None, help="rounds of each (default 3; 1 with --quick)"
    )
    parser.add_argument("--child-round", type=int, default=None, help=argparse.SUPPRESS)  # in_own_process
    parser.add_argument("--name", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_round is not None:
        print(json.dumps(child_round(args.child_round, args.name)))
        return
    if args.stock is None:
        args.stock = ["all"] if args.quick else ["all", "prepared", "sql", "backend"]
    stock_rounds = args.stock_rounds or (1 if args.quick else 3)
    n_speed, n_kill = (300, 300) if args.quick else (5000, 3000)
    rounds = 1 if args.quick else 5
    concurrency = settings.ANKUSA_DISPATCH_CONCURRENCY

    # A database of its own, named apart from the test suite's, so the two can run side by side.
    db = settings.DATABASES["default"]
    name = Path(db["NAME"])
    db.setdefault("TEST", {})["NAME"] = (
        str(name.with_name(f"bench_{name.name}"))
        if db["ENGINE"].endswith("sqlite3")
        else f"bench_{db['NAME']}"
    )
    old_config = setup_databases(verbosity=0, interactive=False)
    sink = SinkProcess()
    try:
        tenant = Tenant.objects.create(slug="bench", name="bench")
        kill = Connector.objects.create(tenant=tenant, name="kill", kind="http", url=sink.url)
        # Warm-up, both sides alike: connections, caches, the loop's prepared statements.
        raw_http(sink.url, min(500, n_speed), concurrency)
        warm = Connector.objects.create(
            tenant=tenant, name="warm-up", kind="http", url=sink.url, idempotent=True
        )
        through_the_loop(warm, min(500, n_speed))
        pairs = []
        for number in range(rounds):
            speed = Connector.objects.create(
                tenant=tenant, name=f"speed-{number}", kind="http", url=sink.url, idempotent=True
            )
            pairs.append((raw_http(sink.url, n_speed, concurrency), through_the_loop(speed, n_speed)))
        raw, loop = (max(column) for column in zip(*pairs, strict=True))
        child_env = {
            **os.environ,
            "DATABASE_URL": database_url(settings.DATABASES["default"]),
            "BENCH_SINK_URL": sink.url,
            "PYTHONPATH": str(BASE_DIR),
        }
        layers = stock_variants(child_env, args.stock, stock_rounds, n_speed)
        lost, double_sent, in_flight = kill_and_restart(sink, kill, n_kill)
    finally:
        sink.stop()
        connection.close()
        teardown_databases(old_config, verbosity=0)

    figures = {
        "dispatch_vs_raw_http": round(loop / raw, 3),
        "lost": lost,
        "double_sent": double_sent,
        "raw_http_per_s": round(raw, 1),
        "dispatch_per_s": round(loop, 1),
        "killed_in_flight": in_flight,
        "database": connection.vendor,
        "concurrency": concurrency,
        "commands": n_speed,
        "rounds": rounds,
        "ratio_per_round": [round(ours / theirs, 3) for theirs, ours in pairs],
        **layers,
        "quick": args.quick,
    }
    print(f"{'measure':<34}{'value':>12}")
    for number, (theirs, ours) in enumerate(pairs, 1):
        print(f"{f'round {number}: raw / loop, per s':<34}{theirs:>12.1f}{ours:>10.1f}")
    print(f"{'raw HTTP (same client), req/s':<34}{raw:>12.1f}")
    print(f"{'dispatch loop, commands/s':<34}{loop:>12.1f}")
    print(f"{'dispatch / raw (target >= 0.5)':<34}{loop / raw:>12.3f}")
    if layers:
        print(f"{'own process':<20}{'per s':>10}{'CPU ms':>10}{'buys (rate)':>13}{'buys (CPU)':>12}")
    for name, own in layers.get("own_process", {}).items():
        buys = ("", "") if name == "fast" else (layers[f"{name}_buys"], layers[f"{name}_buys_cpu"])
        cpu = sum(own["cpu_ms"].values())
        print(f"{name:<20}{own['per_s']:>10.1f}{cpu:>10.3f}{buys[0]:>13}{buys[1]:>12}")
    print(f"{'kill -9: sends in flight':<34}{in_flight:>12}")
    print(f"{'kill -9: lost (must be 0)':<34}{lost:>12}")
    print(f"{'kill -9: double sent (must be 0)':<34}{double_sent:>12}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
