"""Benchmark: one dispatch process against slow receivers (issue 26).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python bench/slow_receivers.py [--quick]

It makes a throw-away PostgreSQL database of its own on that server (``slow_<db>``, dropped at the
end; the server keeps its default ``max_connections``), starts its own receiver process (asyncio,
stdlib only) that answers 200 after a fixed delay and counts requests, keys and the most it held at
once, and runs ``manage.py dispatch`` as a separate process, 8 connectors, three runs:

* ``deep`` — a 5 s receiver, the dispatcher set to 1,000 in flight (bound 200/s; ``--quick``: a
  2 s receiver, bound 500/s); the anchor in the same run is a plain client of the library the
  sender uses (aiohttp, 1,000 tasks on one event loop, as the sender) holding the same 1,000
  requests in flight against the same receiver;
* ``d200`` — a 200 ms receiver, 100 in flight (bound 500/s);
* ``defaults`` — a 1 s receiver, one connector, every setting at its default.

Each run measures over a window after the first answers came back (steady state): ``inflight``
(the most the receiver held at once), ``delivered_per_s``, ``bound_ratio`` = delivered/s ÷
(inflight ÷ delay), ``db_connections_max`` (connections to the bench database, from
``pg_stat_activity``, sampled; the bench's own excluded), ``cpu_ms_per_send`` (the dispatch
process's user + system CPU over the window ÷ the sends in it), ``lost`` (a command recorded
succeeded the receiver never got, one the receiver got not recorded, one left ``dispatching`` or
``queued`` without a queue item after the dispatcher stopped) and ``double_sent`` (keys the
receiver got twice). Then ``kill``: the dispatcher killed with -9 while 1,000 sends wait on a 5 s
receiver (non-idempotent connectors) and restarted until every command ended: nothing lost,
nothing sent twice (left out by ``--quick``, null: the suite holds the same claim in
``tests/commands/test_send_loop.py``; ``--kill-only`` runs it alone). Prints a table, then one
JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent


# --- the receiver (its own process) -----------------------------------------------------------------


def receive(delay: float) -> None:
    """Answer every POST 200 after ``delay`` seconds; ``GET /_stats`` says what it saw."""
    counts: dict[str, int] = {}
    state = {"in_flight": 0, "max_in_flight": 0, "received": 0}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                await reader.readexactly(int(headers.get("content-length") or 0))
                if method == "GET" and path == "/_stats":
                    body = json.dumps({**state, "keys": counts}).encode()
                else:
                    key = headers.get("idempotency-key", "")
                    counts[key] = counts.get(key, 0) + 1
                    state["received"] += 1
                    state["in_flight"] += 1
                    state["max_in_flight"] = max(state["max_in_flight"], state["in_flight"])
                    try:
                        await asyncio.sleep(delay)
                    finally:
                        state["in_flight"] -= 1
                    body = b'{"ok": true}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went, or the receiver is stopping
        finally:
            writer.close()

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
        print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin

    asyncio.run(serve())


def start_receiver(delay: float):
    """This script's receiver (``--receiver``) in its own process, answering after ``delay``."""
    sys.path.insert(0, str(BASE_DIR))
    from tests.commands.sink import ReceiverProcess

    receiver = ReceiverProcess((__file__, "--receiver", str(delay)), cwd=BASE_DIR)
    receiver.delay = delay
    return receiver


# --- the bench (Django set up only here, not in the receiver process) -------------------------------


def phase_rate(samples: list[tuple[float, int]], span: float) -> float:
    """Requests a second from ``(time, count so far)`` samples: the count over ``span`` seconds (whole
    delays), averaged over every start in the samples' first ``len - span`` seconds. Sends go out in
    waves a delay apart, so one window's count depends on where its ends fall in a wave; averaged
    over the phases, it does not."""
    times = [t for t, _ in samples]

    def count_at(t: float) -> float:
        i = max(0, min(bisect.bisect_right(times, t) - 1, len(samples) - 2))
        (t0, c0), (t1, c1) = samples[i], samples[i + 1]
        return c0 + (c1 - c0) * (t - t0) / (t1 - t0)

    rates = [(count_at(t + span) - c) / span for t, c in samples if t + span <= times[-1]]
    return sum(rates) / len(rates)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs (a smoke test, not a measurement)")
    parser.add_argument("--deep-only", action="store_true", help="only the deep run (to study it)")
    parser.add_argument("--kill-only", action="store_true", help="only the kill -9 run (to study it)")
    parser.add_argument("--keep-logs", metavar="DIR", help="keep each dispatcher's log in DIR")
    args = parser.parse_args()
    keep_logs = args.keep_logs

    sys.path.insert(0, str(BASE_DIR))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret-" + "x" * 32)
    os.environ.setdefault("ANKUSA_CONNECTOR_ALLOWED_NETWORKS", "127.0.0.0/8")
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    from commands.dispatch.sends import WORKER_LOST
    from commands.lifecycle import commands_queue
    from commands.models import Command, Connector
    from commands.states import State
    from limits.models import Tenant
    from tests.services import database_url

    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql"):
        raise SystemExit("slow_receivers measures PostgreSQL: set DATABASE_URL to a postgres:// URL")
    db.setdefault("TEST", {})["NAME"] = f"slow_{db['NAME']}"
    old_config = setup_databases(verbosity=0, interactive=False)
    database = settings.DATABASES["default"]["NAME"]

    def connections_now() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [database],
            )
            return cursor.fetchone()[0]

    def run(name: str, *, delay: float, connectors: int, env: dict, pacing: dict, window: float, n: int):
        # The window opens once the first answers are back (the process started, the first sends
        # answered: steady state) and lasts whole multiples of the delay (sends go out in waves).
        opens_after = delay + 3
        seconds = opens_after + window + delay + 1
        receiver = start_receiver(delay)
        try:
            tenant = Tenant.objects.create(slug=name, name=name)
            made = [
                Connector.objects.create(
                    tenant=tenant, name=f"{name}-{c}", kind="http", url=receiver.url, **pacing
                )
                for c in range(connectors)
            ]
            Command.objects.bulk_create(
                [
                    Command(tenant=tenant, connector=made[i % connectors], payload={"order": i})
                    for i in range(n)
                ],
                batch_size=2000,
            )
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE")
            child_env = {
                **os.environ,
                **env,
                "DATABASE_URL": database_url(settings.DATABASES["default"]),
                "PYTHONPATH": str(BASE_DIR),
            }
            dispatcher = subprocess.Popen(
                [sys.executable, "manage.py", "dispatch", "--max-seconds", str(seconds)],
                cwd=BASE_DIR,
                env=child_env,
                stdout=subprocess.DEVNULL,
                # A log line per send: written (its CPU counts), not kept unless asked for.
                stderr=open(f"{keep_logs}/{name}.log", "w") if keep_logs else subprocess.DEVNULL,  # noqa: SIM115
            )
            started = time.monotonic()
            peak_connections = 0
            # Sampled over the window and one delay more, for phase_rate.
            window_open, window_close = started + opens_after, started + opens_after + window + delay
            samples: list[tuple[float, int]] = []
            held: list[int] = []  # the receiver's requests in hand
            cpu = []
            while dispatcher.poll() is None and time.monotonic() < window_close:
                peak_connections = max(peak_connections, connections_now())
                now = time.monotonic()
                if now >= window_open:
                    stats = receiver.stats()
                    samples.append((now, stats["received"]))
                    held.append(stats["in_flight"])
                    cpu.append(cpu_s(dispatcher.pid))
                time.sleep(0.1)
            if dispatcher.poll() is not None or not samples or samples[-1][0] < window_close - 0.5:
                raise SystemExit(f"{name}: the dispatcher ended before its window ({dispatcher.returncode})")
            while dispatcher.poll() is None:
                peak_connections = max(peak_connections, connections_now())
                time.sleep(0.25)
            stats = receiver.stats()
        finally:
            receiver.stop()
        per_s = phase_rate(samples, window)
        sends = samples[-1][1] - samples[0][1]
        inflight = stats["max_in_flight"]
        keys = stats["keys"]
        mine = Command.objects.filter(tenant=tenant)
        succeeded = set(mine.filter(state=State.SUCCEEDED).values_list("pk", flat=True))
        queued_items = {item.payload["command"] for item in commands_queue().peek("main", 10**6)}
        lost = sum(1 for pk in succeeded if str(pk) not in keys)
        lost += sum(1 for key in keys if int(key) not in succeeded)
        lost += mine.filter(state=State.DISPATCHING).count()
        lost += mine.filter(state=State.QUEUED).exclude(pk__in=queued_items).count()
        # What this run left unsent would go to its receiver, gone now, in the next run's window.
        commands_queue().flush()
        mine.exclude(state=State.SUCCEEDED).delete()
        return {
            "inflight": inflight,
            "delivered_per_s": round(per_s, 1),
            "bound_ratio": round(per_s / (inflight / delay), 3) if inflight else 0.0,
            "db_connections_max": peak_connections,
            "cpu_ms_per_send": round((cpu[-1] - cpu[0]) * 1000 / sends, 3) if sends else None,
            "lost": lost,
            "double_sent": sum(1 for count in keys.values() if count > 1),
            "inflight_mean": round(sum(held) / len(held), 1) if held else None,
            "delay_s": delay,
            "sent": len(keys),
        }

    def killed(in_flight: int, n: int) -> dict:
        """``manage.py dispatch`` killed with -9 while ``in_flight`` sends wait on a 5 s receiver, on
        non-idempotent connectors, then restarted until every command has ended: lost (not ended
        ``succeeded``, or ``failed`` with a reason; or succeeded unseen by the receiver) and sent
        twice must both be 0."""
        receiver = start_receiver(5.0)
        try:
            tenant = Tenant.objects.create(slug="kill", name="kill")
            made = [
                Connector.objects.create(
                    tenant=tenant,
                    name=f"kill-{c}",
                    kind="http",
                    url=receiver.url,
                    max_in_flight=in_flight // 8,
                )
                for c in range(8)
            ]
            Command.objects.bulk_create(
                [Command(tenant=tenant, connector=made[i % 8], payload={"order": i}) for i in range(n)],
                batch_size=2000,
            )
            env = {
                **os.environ,
                "ANKUSA_DISPATCH_CONCURRENCY": str(in_flight),
                "ANKUSA_DISPATCH_BATCH": "500",
                "ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S": "10",
                "ANKUSA_HTTP_CONNECT_TIMEOUT_S": "1",
                "ANKUSA_HTTP_READ_TIMEOUT_S": "7",
                "ANKUSA_DISPATCH_RECOVER_S": "1",
                "ANKUSA_DISPATCH_INTERVAL_S": "1",
                "DATABASE_URL": database_url(settings.DATABASES["default"]),
                "PYTHONPATH": str(BASE_DIR),
            }
            command = [sys.executable, "manage.py", "dispatch"]
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            if keep_logs:
                quiet["stderr"] = open(f"{keep_logs}/kill-first.log", "w")  # noqa: SIM115
            first = subprocess.Popen(command, cwd=BASE_DIR, env=env, **quiet)
            deadline = time.monotonic() + 60
            while receiver.stats()["in_flight"] < in_flight and time.monotonic() < deadline:
                time.sleep(0.1)
            held = receiver.stats()["in_flight"]
            print(f"kill: {held} in flight at the kill", file=sys.stderr)
            first.send_signal(signal.SIGKILL)
            first.wait()
            if keep_logs:
                quiet["stderr"] = open(f"{keep_logs}/kill-second.log", "w")  # noqa: SIM115
            second = subprocess.Popen(command, cwd=BASE_DIR, env=env, **quiet)
            mine = Command.objects.filter(tenant=tenant)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                if not mine.exclude(state__in=[State.SUCCEEDED, State.FAILED]).exists():
                    break
                time.sleep(0.5)
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=60)
            keys = receiver.stats()["keys"]
        finally:
            receiver.stop()
        ended = (
            mine.filter(state=State.SUCCEEDED).count()
            + mine.filter(state=State.FAILED).exclude(skip_reason="").count()
        )
        lost = n - ended
        lost += sum(
            1 for pk in mine.filter(state=State.SUCCEEDED).values_list("pk", flat=True) if str(pk) not in keys
        )
        return {
            "killed_in_flight": held,
            "lost": lost,
            "double_sent": sum(1 for count in keys.values() if count > 1),
            "worker_lost": mine.filter(last_error_class=WORKER_LOST).count(),
        }

    def anchor(delay: float, in_flight: int, seconds: float) -> dict:
        """A plain client of the sender's library (aiohttp: ``in_flight`` tasks on one event loop,
        each posting again as soon as its answer is back, one session)."""
        import aiohttp

        receiver = start_receiver(delay)
        body = json.dumps({"order": 1}).encode()
        count = [0]
        samples: list[tuple[float, int]] = []
        cpu: list[float] = []

        async def main() -> None:
            stop = asyncio.Event()
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def work(number: int) -> None:
                    sent = 0
                    while not stop.is_set():
                        headers = {"Content-Type": "application/json", "Idempotency-Key": f"{number}-{sent}"}
                        async with session.post(receiver.url, data=body, headers=headers) as response:
                            await response.read()
                        sent += 1
                        count[0] += 1

                tasks = [asyncio.create_task(work(n)) for n in range(in_flight)]
                await asyncio.sleep(delay + 3)  # as the dispatcher's window: after the first answers
                ends = time.monotonic() + seconds + delay
                while time.monotonic() < ends:
                    samples.append((time.monotonic(), count[0]))
                    cpu.append(time.process_time())
                    await asyncio.sleep(0.1)
                stop.set()
                await asyncio.wait(tasks, timeout=delay + 10)

        try:
            # Its own thread, as the stats requests to the receiver block.
            thread = threading.Thread(target=asyncio.run, args=(main(),))
            thread.start()
            thread.join()
            stats = receiver.stats()
        finally:
            receiver.stop()
        sends = samples[-1][1] - samples[0][1]
        return {
            "per_s": phase_rate(samples, seconds),
            "cpu_ms_per_request": (cpu[-1] - cpu[0]) * 1000 / sends if sends else None,
            "inflight": stats["max_in_flight"],
        }

    quick = args.quick
    waves = 2 if quick else 3  # the window of the deep run, in delays
    # --quick: a 2 s receiver, for the same 1,000 in flight in less than half the time.
    deep_delay = 2.0 if quick else 5.0
    defaults_window = 4.0 if quick else 12.0
    try:
        if args.kill_only:
            print(json.dumps(killed(1000, 1000 if quick else 2000)))
            return
        deep = run(
            "deep",
            delay=deep_delay,
            connectors=8,
            env={"ANKUSA_DISPATCH_CONCURRENCY": "1000", "ANKUSA_DISPATCH_BATCH": "500"},
            pacing={"max_in_flight": 125},
            window=deep_delay * waves,
            n=1000 * (waves + 3) + 1000,  # 1,000 a delay, for the window and the run's start and end
        )
        if args.deep_only:
            print(json.dumps(deep))
            return
        anchored = anchor(deep_delay, 1000, deep_delay * waves)
        deep["vs_async_client"] = round(deep["delivered_per_s"] / anchored["per_s"], 3)
        deep["anchor_per_s"] = round(anchored["per_s"], 1)
        deep["anchor_cpu_ms_per_request"] = round(anchored["cpu_ms_per_request"], 3)
        deep["anchor_inflight"] = anchored["inflight"]
        d200_window = 4.0 if quick else 8.0
        d200 = run(
            "d200",
            delay=0.2,
            connectors=8,
            env={"ANKUSA_DISPATCH_CONCURRENCY": "100"},
            pacing={"max_in_flight": 13},
            window=d200_window,
            n=int(500 * (d200_window + 6)) + 100,
        )
        defaults = run(
            "defaults",
            delay=1.0,
            connectors=1,
            env={},
            pacing={},
            window=defaults_window,
            n=int(60 * (defaults_window + 7)),
        )
        kill = None if quick else killed(1000, 2000)
    finally:
        connection.close()
        teardown_databases(old_config, verbosity=0)

    rows = [
        ("deep: in flight (target >= 1000)", deep["inflight"]),
        (f"deep: delivered/s (bound {1000 / deep_delay:.0f})", deep["delivered_per_s"]),
        ("deep: bound ratio (target >= 0.9)", deep["bound_ratio"]),
        ("deep: anchor client, req/s", deep["anchor_per_s"]),
        ("deep: vs anchor (target >= 0.8)", deep["vs_async_client"]),
        ("deep: CPU ms per send", deep["cpu_ms_per_send"]),
        ("deep: anchor CPU ms per request", deep["anchor_cpu_ms_per_request"]),
        ("deep: db connections (<= 8)", deep["db_connections_max"]),
        ("d200: in flight", d200["inflight"]),
        ("d200: delivered/s (bound 500)", d200["delivered_per_s"]),
        ("d200: bound ratio (target >= 0.8)", d200["bound_ratio"]),
        ("d200: CPU ms per send", d200["cpu_ms_per_send"]),
        ("d200: db connections (<= 8)", d200["db_connections_max"]),
        ("defaults: in flight", defaults["inflight"]),
        ("defaults: delivered/s (>= 30)", defaults["delivered_per_s"]),
        ("defaults: db connections (<= 8)", defaults["db_connections_max"]),
        ("kill -9: sends in flight", kill and kill["killed_in_flight"]),
        ("kill -9: lost (must be 0)", kill and kill["lost"]),
        ("kill -9: double sent (must be 0)", kill and kill["double_sent"]),
        ("lost, all runs (must be 0)", deep["lost"] + d200["lost"] + defaults["lost"]),
        (
            "double sent, all runs (must be 0)",
            deep["double_sent"] + d200["double_sent"] + defaults["double_sent"],
        ),
    ]
    print(f"{'measure':<40}{'value':>12}")
    for label, value in rows:
        print(f"{label:<40}{value!s:>12}")
    print(json.dumps({**deep, "d200": d200, "defaults": defaults, "kill": kill, "quick": quick}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--receiver":
        receive(float(sys.argv[2]))
    else:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        bench()
