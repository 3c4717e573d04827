"""Benchmark: accepted webhooks per second through the whole intake, over a bare Django view's requests
per second on the same gunicorn, in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python bench/intake.py [--quick]
        [--only postgres|sqlite]

Two set-ups, each on a throw-away database it creates and drops (PostgreSQL: ``bench_intake_<pid>``
on the server ``DATABASE_URL`` names; SQLite: a file in a temporary folder):

* **postgres** — PostgreSQL with the fleet store (Redis at ``REDIS_URL``, its keys under a tenant
  named for this run, deleted at the end): the issue's figure;
* **sqlite** — SQLite with the node-local store: the embedded default.

For each, gunicorn serves ``bench/intake_server.py`` (the site plus ``POST /bench/bare/``, a view that
reads the body and answers JSON) with the same workers and threads for both kinds of request. This
process drives it over keep-alive connections from ``--concurrency`` threads, with requests built
and signed before the clock starts, alternating rounds of bare and intake requests of the same
length (``--seconds``, 3 by default; ``--rounds`` of each, 6) and keeping each kind's best round
(the machine may be shared). An intake request is a GitHub-signed webhook with its
own ``X-GitHub-Delivery``: verified, admitted (quota + claim), stored as a delivery with one command,
queued, the claim settled.

On the same server, in the same rounds, two more kinds. The durable floor (``POST /bench/floor/``):
the bare view plus one committed ``INSERT`` of the body into a table with nothing but its key —
the least any receiver that keeps what it answers 2xx to can do, and so a bound on what the intake
can reach on this machine. And the same signed webhooks to the receiver a Django team would write
without Ankusa (``bench/obvious_django.py``: DRF, django-ratelimit on the same Redis,
``get_or_create`` and the ORM in one transaction). And beside the site's server, one
gunicorn per variant, driven with the same webhooks in each round: ``ANKUSA_STOCK_DJANGO`` for
every value of ``--stock`` (by default ``all``, then each layer alone: ``handler``, ``prepared``,
``sql``, ``backend``), and, with the fleet store, ``ANKUSA_SETTLE_AFTER_ANSWER=0`` (the claim
settled before the answer, one round trip per webhook). With ``--without-waits`` (PostgreSQL),
three more: the intake with the fleet store's round trip, its statement's, or both answered in
each worker from a recording of real ones (``bench/gunicorn_replayed.py``, ``bench/replay.py``;
only the first of each is stored) — what the intake would do if it did not wait for them, which
the guarantees forbid (the claim before the commit, the 202 after it).

Figures (the JSON line at the end):

* ``intake_vs_obvious_django`` (and ``_sqlite``) — accepted webhooks/s, ours ÷ the obvious
  receiver's, best rounds (target ≥ 2.0); ``_paired``: the median of the same within each round;
  ``obvious_vs_bare_view``: the peer's own ratio to the bare view;
* for each variant (``stock``, ``stock_handler`` … ``settle_in_request``, ``without_store_wait`` …):
  ``intake_vs_bare_view_<v>``, ``p50_ms_<v>``, ``p99_ms_<v>`` and ``<v>_buys`` — the site's
  accepted webhooks/s ÷ the variant's: what the fast path (or settling after the answer) buys,
  above 1 when it buys anything; below 1 for a ``without_*`` variant, whose wait it prices;
* ``..._worker_cpu`` beside those: the same comparison made with the gunicorn workers' own CPU
  per webhook (median over rounds; the other's ÷ ours, above 1 when ours costs less) — on a shared
  machine throughput moves with the neighbours' load, a worker's CPU per request much less;

* ``intake_vs_bare_view`` — accepted webhooks/s ÷ bare view requests/s, PostgreSQL + fleet store
  (target ≥ 0.35); ``intake_vs_bare_view_sqlite`` — the same on SQLite with the local store;
* ``durable_floor_vs_bare_view`` (and ``_sqlite``) — the durable floor's requests/s ÷ the bare
  view's, best rounds: the most the intake's ratio could be on this machine, were everything it
  does beyond storing the body free; ``intake_vs_durable_floor`` (and ``_sqlite``): ours ÷ the
  floor, and ``_paired`` the median of the same within each round;
* ``intake_vs_bare_view_paired`` (and ``_sqlite``) — the median over rounds of the same ratio
  within one pair of neighbouring rounds: the two kinds then share the machine's mood, so it
  moves less from run to run than the ratio of two best rounds taken at different moments;
* ``p50_ms`` / ``p99_ms`` (and ``_sqlite``) — intake latency in the best round, at that concurrency;
* ``accepted_not_stored`` — 2xx answers whose delivery is missing afterwards, over every round of
  both set-ups. Must be 0;
* ``cpu_ms`` (and ``_sqlite``) — CPU milliseconds per request in the best round of the bare view,
  the intake and the durable floor, read from ``/proc`` around the round: the gunicorn workers,
  PostgreSQL's processes, Redis, this client, and the whole machine (``machine``: every process
  and the kernel). Throughput on a shared two-core machine moves from round to round; CPU per
  request moves much less, and says where a webhook's cost goes. ``intake_vs_bare_view_cpu`` is
  the bare view's machine CPU per request over the intake's: the ratio the throughput one would be
  if both kept the machine equally busy.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import redis

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET = "bench-webhook-secret"
# Requests built for a round, per second of it: more than either kind is answered per second here.
BARE_CAP_PER_S, INTAKE_CAP_PER_S = 6000, 2000
BODY = json.dumps(
    {"order": "A-1", "action": "ship", "lines": [{"sku": f"SKU-{n}", "qty": n} for n in range(8)]}
)

SEED = """
from commands.models import Connector, Source
from limits.models import Tenant
tenant = Tenant.objects.create(slug={slug!r}, name="bench")
# One body under many delivery ids: deduped on the event id, as the figures have always measured.
source = Source.objects.create(
    tenant=tenant, slug="orders", verifier="github", verifier_secrets=[{secret!r}], dedupe_key="github",
    dedupe_body=False,
)
source.connectors.set([Connector.objects.create(tenant=tenant, name="log", kind="log")])
"""

DEPLOYED = "ankusa_site.gunicorn_conf"
# --without-waits: the intake with its store's round trip, its statement's, or both answered in
# the worker (bench/replay.py), by variant.
WITHOUT_WAITS = {
    "without_store_wait": "store",
    "without_statement_wait": "statement",
    "without_either_wait": "store,statement",
}

ANALYZE = "from django.db import connection; connection.cursor().execute('ANALYZE')"

# The durable floor's table (bench/intake_server.py): the body and a key, nothing else.
FLOOR = """
from django.db import connection
from bench.intake_server import FLOOR_TABLE
key = {"postgresql": "bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"}.get(
    connection.vendor, "integer PRIMARY KEY AUTOINCREMENT"
)
with connection.cursor() as cursor:
    cursor.execute(f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (id {key}, body text NOT NULL)")
"""

CHECK = """
import json, sys
from commands.models import Delivery
ids = json.load(sys.stdin)
found = set()
for start in range(0, len(ids), 5000):
    found.update(Delivery.objects.filter(pk__in=ids[start:start + 5000]).values_list("pk", flat=True))
print(json.dumps({"missing": len(set(ids) - found), "stored": Delivery.objects.count()}))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def python(env: dict, *args: str, stdin: str | None = None, what: str = "") -> str:
    """Run this Python with ``args`` in the project's folder; its output, or an error that ends
    with the end of its stderr."""
    result = subprocess.run(
        [sys.executable, *args], cwd=BASE_DIR, env=env, input=stdin, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"{what or args[0]} failed:\n{result.stderr[-3000:]}")
    return result.stdout


def manage(env: dict, *args: str, stdin: str | None = None) -> str:
    return python(env, "manage.py", *args, stdin=stdin, what=f"manage.py {args[0]}")


# --- a small keep-alive HTTP client (cheap enough not to be the bottleneck on two cores) ---------


def raw_post(port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Connection:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def send(self, request: bytes) -> tuple[int, bytes]:
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            int(line.split(":", 1)[1]) for line in lines[1:] if line.lower().startswith("content-length:")
        )
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return status, body

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


# --- CPU per request, from /proc (Linux) ---------------------------------------------------------

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(workers: set[int]) -> dict[str, float]:
    """CPU seconds used so far by the gunicorn ``workers``, PostgreSQL, Redis, this process and the
    whole machine (empty where /proc cannot be read)."""
    used = Counter()
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()[1:9]
    except OSError:
        return {}
    ticks = [int(n) for n in fields]
    used["machine"] = (sum(ticks) - ticks[3] - ticks[4]) / TICKS_PER_S  # all but idle and iowait
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            name, seconds = process_cpu(pid)
        except OSError:  # ended meanwhile
            continue
        if pid in workers:
            used["workers"] += seconds
        elif name.startswith("postgres"):
            used["postgres"] += seconds
        elif name.startswith("redis-server"):
            used["redis"] += seconds
        elif pid == os.getpid():
            used["client"] += seconds
    return dict(used)


def process_cpu(pid: int) -> tuple[str, float]:
    """A process's name and the CPU seconds it has used (its utime and stime in /proc)."""
    with open(f"/proc/{pid}/stat") as process:
        stat = process.read()
    rest = stat[stat.rindex(")") + 2 :].split()
    return stat[stat.index("(") + 1 : stat.rindex(")")], (int(rest[11]) + int(rest[12])) / TICKS_PER_S


def cpu_ms_per_request(before: dict, after: dict, requests: int) -> dict[str, float]:
    # A process that ended during the round (a PostgreSQL backend) is missed; "machine" is not.
    return {kind: round(1000 * (after[kind] - before.get(kind, 0)) / requests, 3) for kind in after}


def connections_by_worker(port: int, workers) -> dict[int, int]:
    """How many established TCP connections to ``port`` each of the ``workers`` has accepted, from
    /proc (Linux; empty where it cannot be read)."""
    established = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                next(rows)
                for row in rows:
                    fields = row.split()  # local address, remote, state ("01": established), ... inode
                    if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        established.add(f"socket:[{fields[9]}]")
        except OSError:
            return {}
    held = {}
    for pid in workers:
        links = []
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours to read
            continue
        for fd in descriptors:
            try:
                links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:  # closed meanwhile
                pass
        held[pid] = sum(link in established for link in links)
    return held


def drive(
    port: int,
    requests: list[bytes],
    concurrency: int,
    workers: set[int] = frozenset(),
    seconds: float | None = None,
) -> dict:
    """Send the requests over ``concurrency`` keep-alive connections: all of them, or as many as
    ``seconds`` allow (each connection stops after the answer that crosses the deadline); rate,
    statuses, latencies, CPU per answered request, and (a timed round with its ``workers``) how
    many of the connections each worker held at half the round, most first."""
    results: list[list[tuple[int, bytes, float]]] = [[] for _ in range(concurrency)]
    failures: list[Exception] = []
    ready = threading.Barrier(concurrency + 1)

    def work(slot: int) -> None:
        conn = Connection(port)
        ready.wait()
        deadline = time.perf_counter() + seconds if seconds else float("inf")
        try:
            for request in requests[slot::concurrency]:
                started = time.perf_counter()
                if started >= deadline:
                    break
                status, body = conn.send(request)
                results[slot].append((status, body, time.perf_counter() - started))
        except Exception as exc:  # a rate over what the failed connections left would be a lie
            failures.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=work, args=(slot,)) for slot in range(concurrency)]
    for thread in threads:
        thread.start()
    ready.wait()
    cpu_before = cpu_seconds(workers)
    started = time.perf_counter()
    split: dict[int, int] = {}
    timer: threading.Timer | None = None
    if seconds and workers:  # which worker holds which connections, at half the round
        timer = threading.Timer(seconds / 2, lambda: split.update(connections_by_worker(port, workers)))
        timer.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if timer is not None:
        timer.cancel()
        timer.join()
    cpu_after = cpu_seconds(workers)
    if failures:
        raise RuntimeError(f"{len(failures)} of {concurrency} connections failed: {failures[0]!r}")
    answers = [answer for slot in results for answer in slot]
    latencies = sorted(seconds for _, _, seconds in answers)
    return {
        "per_s": len(answers) / elapsed,
        "statuses": Counter(status for status, _, _ in answers),
        "accepted": [json.loads(body).get("id") for status, body, _ in answers if 200 <= status < 300],
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000,
        "cpu_ms": cpu_ms_per_request(cpu_before, cpu_after, len(answers)),
        "connections_by_worker": sorted(split.values(), reverse=True),
    }


def signature(body: bytes) -> str:
    """The ``X-Hub-Signature-256`` GitHub sends for ``body`` under the bench source's secret."""
    return "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()


def webhooks(port: int, tenant: str, n: int, prefix: str = "/hooks") -> list[bytes]:
    """``n`` GitHub-signed webhooks to the bench source, each with its own delivery id, under
    ``prefix`` (``/hooks``: the intake; ``/bench/obvious``: the peer)."""
    body = BODY.encode()
    signed = signature(body)
    return [
        raw_post(
            port,
            f"{prefix}/{tenant}/orders/",
            {
                "Content-Type": "application/json",
                "X-GitHub-Event": "push",
                "X-GitHub-Delivery": secrets.token_hex(16),
                "X-Hub-Signature-256": signed,
            },
            body,
        )
        for _ in range(n)
    ]


# --- one set-up: a database, a store, a gunicorn -------------------------------------------------


class Server:
    """gunicorn serving ``bench/intake_server.py`` with the deployed server's settings
    (``ankusa_site.gunicorn_conf``, as deploy/Procfile), or the settings module ``config`` names,
    and, as ``manage.py serve`` and the deploy units, a ``PROMETHEUS_MULTIPROC_DIR`` of its own: the
    workers then count into shared files, as they do when deployed."""

    def __init__(self, env: dict, workers: int, threads: int, config: str = DEPLOYED):
        self.port = free_port()
        self.metrics_dir = tempfile.mkdtemp(prefix="ankusa-bench-metrics-")
        env = {**env, "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir}
        command = [sys.executable, "-m", "gunicorn", "bench.intake_server", "--bind", f"127.0.0.1:{self.port}",
                   "--config", f"python:{config}",
                   "--workers", str(workers), "--threads", str(threads)]  # fmt: skip
        self.process = subprocess.Popen(
            command, cwd=BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while not self._ready():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError("gunicorn did not start")
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            conn = Connection(self.port)
        except OSError:
            return False
        try:
            return (
                conn.send(f"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode())[0] == 200
            )
        except (OSError, ConnectionError):
            return False
        finally:
            conn.close()

    def workers(self) -> set[int]:
        """The worker processes' ids (gunicorn's master forks them)."""
        try:
            with open(f"/proc/{self.process.pid}/task/{self.process.pid}/children") as children:
                return {int(pid) for pid in children.read().split()}
        except OSError:
            return set()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)


def prepare(env: dict) -> str:
    """Migrate the set-up's database and seed a tenant named for the run; its slug."""
    tenant = f"bench-{os.getpid()}-{secrets.token_hex(3)}"
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "shell", "-c", SEED.format(slug=tenant, secret=SECRET))
    manage(env, "shell", "-c", FLOOR)
    return tenant


def warm_up(server: Server, tenant: str, concurrency: int) -> None:
    """Connections, code paths, the statements prepared and the route kept, before any round."""
    drive(server.port, [bare_request(server.port)] * 50, concurrency)
    drive(server.port, [bare_request(server.port, "/bench/floor/")] * 50, concurrency)
    drive(server.port, webhooks(server.port, tenant, 200), concurrency)


def bare_request(port: int, path: str = "/bench/bare/") -> bytes:
    """A request to the bare view, or (``path``) to the durable floor."""
    return raw_post(port, path, {"Content-Type": "application/json"}, BODY.encode())


def floor_round(server: Server, args) -> dict:
    """A round of requests to the durable floor, ``args.seconds`` long."""
    requests = [bare_request(server.port, "/bench/floor/")] * int(BARE_CAP_PER_S * args.seconds)
    return drive(server.port, requests, args.concurrency, server.workers(), args.seconds)


def one_round(server: Server, tenant: str, args) -> tuple[dict, dict]:
    """A round of bare requests, then one of webhooks, each ``args.seconds`` long: what ``drive``
    says of each.

    Rounds of the same length for both kinds, not of the same count: with 1,500 requests each, a
    bare round lasted a quarter as long as an intake round, so its start (new connections, the
    first requests) weighed four times as much, and the best of each kind was picked among
    windows of different sizes."""
    workers = server.workers()
    bare_round = [bare_request(server.port)] * int(BARE_CAP_PER_S * args.seconds)
    bare = drive(server.port, bare_round, args.concurrency, workers, args.seconds)
    hooks = webhooks(server.port, tenant, int(INTAKE_CAP_PER_S * args.seconds))
    return bare, drive(server.port, hooks, args.concurrency, workers, args.seconds)


def hook_round(server: Server, tenant: str, args, prefix: str = "/hooks") -> dict:
    """A round of webhooks, ``args.seconds`` long, to the intake or (``prefix``) the peer."""
    hooks = webhooks(server.port, tenant, int(INTAKE_CAP_PER_S * args.seconds), prefix)
    return drive(server.port, hooks, args.concurrency, server.workers(), args.seconds)


def variants(name: str, args) -> dict[str, tuple[dict[str, str], str]]:
    """The servers measured beside the site as deployed, each with what its environment changes
    and its gunicorn settings module: every fast path back to stock Django, each layer alone, and
    (fleet store only) the claim settled before the answer and the what-ifs of ``--without-waits``."""
    found = {}
    for layer in args.stock:
        found["stock" if layer == "all" else f"stock_{layer}"] = ({"ANKUSA_STOCK_DJANGO": layer}, DEPLOYED)
    if name == "postgres" and not args.quick:
        found["settle_in_request"] = ({"ANKUSA_SETTLE_AFTER_ANSWER": "0"}, DEPLOYED)
    if name == "postgres" and args.without_waits:
        for variant, waits in WITHOUT_WAITS.items():
            found[variant] = ({"BENCH_REPLAY": waits}, "bench.gunicorn_replayed")
    return found


def measure(name: str, env: dict, args) -> dict:
    """Every kind of request in alternating rounds, one gunicorn per variant: the bare view, the
    intake and the obvious Django receiver on the site's own server, then the intake on each
    variant's; the best round of each kind."""
    tenant = prepare(env)
    servers = {"fast": Server(env, args.workers, args.threads)}
    try:
        for variant, (changes, config) in variants(name, args).items():
            servers[variant] = Server({**env, **changes}, args.workers, args.threads, config)
        for server in servers.values():
            warm_up(server, tenant, args.concurrency)
        drive(
            servers["fast"].port,
            webhooks(servers["fast"].port, tenant, 200, "/bench/obvious"),
            args.concurrency,
        )
        # A fresh database has no planner statistics: give it those autovacuum would have, before
        # the statements are planned for good (prepared after a few runs).
        manage(env, "shell", "-c", ANALYZE)
        best: dict[str, dict] = {}
        accepted, statuses, paired = [], Counter(), {"bare": [], "obvious": [], "floor": []}
        worker_cpu: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            bare, intake = one_round(servers["fast"], tenant, args)
            rounds = {"bare": bare, "intake": intake}
            rounds["floor"] = floor_round(servers["fast"], args)
            rounds["obvious"] = hook_round(servers["fast"], tenant, args, "/bench/obvious")
            for variant, server in servers.items():
                if variant != "fast":
                    rounds[variant] = hook_round(server, tenant, args)
            paired["bare"].append(intake["per_s"] / bare["per_s"])
            paired["obvious"].append(intake["per_s"] / rounds["obvious"]["per_s"])
            paired["floor"].append(intake["per_s"] / rounds["floor"]["per_s"])
            for kind, result in rounds.items():
                if kind != "bare":
                    statuses += result["statuses"]
                if kind not in ("bare", "floor"):  # the floor's ids are its own table's
                    accepted += result["accepted"]
                if result["cpu_ms"].get("workers"):
                    worker_cpu.setdefault(kind, []).append(result["cpu_ms"]["workers"])
                if kind not in best or result["per_s"] > best[kind]["per_s"]:
                    best[kind] = result
            print(
                f"  {name}: "
                + "  ".join(f"{kind} {result['per_s']:.0f}/s" for kind, result in rounds.items())
                + f"  (this pair: {paired['bare'][-1]:.3f} of bare, {paired['obvious'][-1]:.2f}x obvious)",
                flush=True,
            )
    finally:
        for server in servers.values():
            server.stop()
    check = json.loads(manage(env, "shell", "-c", CHECK, stdin=json.dumps(accepted)).strip().splitlines()[-1])
    return {
        "bare_per_s": best["bare"]["per_s"],
        "intake_per_s": best["intake"]["per_s"],
        "ratio": best["intake"]["per_s"] / best["bare"]["per_s"],
        "paired": statistics.median(paired["bare"]),
        "paired_obvious": statistics.median(paired["obvious"]),
        "paired_floor": statistics.median(paired["floor"]),
        "p50_ms": best["intake"]["p50_ms"],
        "p99_ms": best["intake"]["p99_ms"],
        "answers": dict(statuses),
        "accepted_not_stored": check["missing"],
        "cpu_ms": {kind: best[kind]["cpu_ms"] for kind in ("bare", "intake", "floor")},
        # The gunicorn workers' own CPU per request, median over rounds: unlike throughput, it
        # hardly moves with what else the shared machine runs.
        "worker_cpu_ms": {kind: statistics.median(ms) for kind, ms in worker_cpu.items()},
        "others": {
            kind: {"per_s": r["per_s"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"]}
            for kind, r in best.items()
            if kind not in ("bare", "intake")
        },
    }


def peer_figures(result: dict | None, suffix: str) -> dict:
    """The JSON keys of the floor, the peer and the variants: ``durable_floor_vs_bare_view`` and
    ``intake_vs_durable_floor`` (and its paired median), ``intake_vs_obvious_django`` (ours ÷ the
    obvious receiver, accepted webhooks/s; and its paired median), and for each variant its
    throughput over the bare view (``intake_vs_bare_view_<variant>``), p50/p99, and what the fast
    way buys over it (``<variant>_buys``: ours ÷ the variant's)."""
    if result is None:
        return {}
    others = result["others"]
    floor = others["floor"]["per_s"]
    figures = {
        f"durable_floor_vs_bare_view{suffix}": round(floor / result["bare_per_s"], 3),
        f"intake_vs_durable_floor{suffix}": round(result["intake_per_s"] / floor, 3),
        f"intake_vs_durable_floor_paired{suffix}": round(result["paired_floor"], 3),
        f"intake_vs_obvious_django{suffix}": round(result["intake_per_s"] / others["obvious"]["per_s"], 3),
        f"intake_vs_obvious_django_paired{suffix}": round(result["paired_obvious"], 3),
        f"obvious_vs_bare_view{suffix}": round(others["obvious"]["per_s"] / result["bare_per_s"], 3),
    }
    cpu = result["worker_cpu_ms"]
    if cpu.get("intake") and cpu.get("obvious"):
        figures[f"intake_vs_obvious_django_worker_cpu{suffix}"] = round(cpu["obvious"] / cpu["intake"], 3)
    for kind, other in others.items():
        if kind in ("obvious", "floor"):
            continue
        if cpu.get("intake") and cpu.get(kind):
            figures[f"{kind}_buys_worker_cpu{suffix}"] = round(cpu[kind] / cpu["intake"], 3)
        figures[f"intake_vs_bare_view_{kind}{suffix}"] = round(other["per_s"] / result["bare_per_s"], 3)
        figures[f"p50_ms_{kind}{suffix}"] = round(other["p50_ms"], 1)
        figures[f"p99_ms_{kind}{suffix}"] = round(other["p99_ms"], 1)
        figures[f"{kind}_buys{suffix}"] = round(result["intake_per_s"] / other["per_s"], 3)
    return figures


def cpu_text(cpu_ms: dict) -> str:
    return "  CPU ms/request: " + " ".join(f"{kind} {ms:.2f}" for kind, ms in cpu_ms.items())


def cpu_ratio(result: dict) -> float | None:
    bare, intake = result["cpu_ms"]["bare"].get("machine"), result["cpu_ms"]["intake"].get("machine")
    return round(bare / intake, 3) if bare and intake else None


def base_env(**changes: str) -> dict:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ankusa_site.settings",
        "DEBUG": "0",
        "SECRET_KEY": "bench-only-not-a-secret-" + "x" * 32,
        "PYTHONPATH": str(BASE_DIR),
    }
    env.update(changes)
    return env


@contextlib.contextmanager
def throwaway_database(url: str, prefix: str):
    """A new database ``<prefix>_<pid>`` on the PostgreSQL server ``url`` names, dropped after
    (its connections too); yields its URL."""
    parts = urlsplit(url)
    name = f"{prefix}_{os.getpid()}"
    admin_url = urlunsplit(parts._replace(path="/postgres", query=""))
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def run_postgres(url: str, args, measure=measure) -> dict:
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        with throwaway_database(url, "bench_intake") as database_url:
            env = base_env(DATABASE_URL=database_url, ANKUSA_STORE_SCOPE="fleet", REDIS_URL=redis_url)
            return measure("postgres", env, args)
    finally:
        # Every tenant this process made (prepare), whether or not its run finished: a run that
        # failed half-way left its claims behind.
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"ankusa:{{bench-{os.getpid()}-*", count=1000))
        for start in range(0, len(keys), 1000):
            client.delete(*keys[start : start + 1000])


def run_sqlite(args, measure=measure) -> dict:
    folder = tempfile.mkdtemp(prefix="bench-intake-")
    try:
        env = base_env(
            DATABASE_URL=f"sqlite:///{folder}/bench.sqlite3", ANKUSA_STORE_SCOPE="node", ANKUSA_VAR_DIR=folder
        )
        return measure("sqlite", env, args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_setups(args, measure=measure) -> dict[str, dict]:
    """``measure`` on each set-up ``--only`` allows: PostgreSQL (when ``DATABASE_URL`` names a
    server), then SQLite."""
    database_url = os.environ.get("DATABASE_URL", "")
    results = {}
    if args.only in (None, "postgres"):
        if database_url.startswith(("postgres://", "postgresql://")):
            results["postgres"] = run_postgres(database_url, args, measure)
        else:
            print("postgres: skipped (DATABASE_URL names no PostgreSQL server)")
    if args.only in (None, "sqlite"):
        results["sqlite"] = run_sqlite(args, measure)
    return results


def rounds_parser(description: str) -> argparse.ArgumentParser:
    """The options of a benchmark that serves the set-ups with gunicorn and drives them in rounds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a short run (a smoke test, not a measurement)")
    parser.add_argument("--only", choices=["postgres", "sqlite"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each round (default 3)")
    parser.add_argument("--rounds", type=int, default=6)
    return parser


def stock_option(
    parser: argparse.ArgumentParser,
    where: str = "each on its own server",
    layers: str = "each layer alone",
) -> None:
    parser.add_argument(
        "--stock",
        default=None,
        type=lambda value: [v.strip() for v in value.split(",") if v.strip()],
        help=f"ANKUSA_STOCK_DJANGO values measured beside the fast paths, {where} "
        f"(default: all of them at once, then {layers}; with --quick, all at once); '' for none",
    )


def parse_rounds(parser: argparse.ArgumentParser) -> argparse.Namespace:
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 0.3, 1
    return args


def main() -> None:
    parser = rounds_parser(__doc__.splitlines()[0])
    stock_option(parser)
    parser.add_argument(
        "--without-waits",
        action="store_true",
        help="PostgreSQL: also serve the intake with its store's round trip, its statement's, and both "
        "answered in the worker from a recording (what the target would need)",
    )
    args = parse_rounds(parser)
    if args.stock is None:
        args.stock = ["all"] if args.quick else ["all", "handler", "prepared", "sql", "backend"]

    results = run_setups(args)

    print(
        f"\ngunicorn {args.workers} workers x {args.threads} threads, {args.concurrency} client connections, "
        f"{args.rounds} rounds of {args.seconds:g} s for each kind, alternating (best kept)"
    )
    print(
        f"{'set-up':<10} {'bare/s':>8} {'intake/s':>9} {'ratio':>6} {'paired':>7} {'p50 ms':>7} {'p99 ms':>7}"
        "  answers"
    )
    for name, r in results.items():
        print(
            f"{name:<10} {r['bare_per_s']:8.0f} {r['intake_per_s']:9.0f} {r['ratio']:6.2f} {r['paired']:7.2f} "
            f"{r['p50_ms']:7.1f} {r['p99_ms']:7.1f}  {r['answers']}"
        )
    print(
        f"\n{'set-up':<10} {'receiver':<20} {'webhooks/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'ours ÷ it':>9}"
        f" {'worker CPU ms':>13}"
    )
    for name, r in results.items():
        cpu = r["worker_cpu_ms"]
        print(f"{name:<10} {'intake (ours)':<20} {r['intake_per_s']:10.0f} {r['p50_ms']:7.1f} {r['p99_ms']:7.1f}"
              f" {'':>9} {cpu.get('intake', 0):13.3f}")  # fmt: skip
        for kind, other in r["others"].items():
            print(
                f"{name:<10} {kind:<20} {other['per_s']:10.0f} {other['p50_ms']:7.1f} {other['p99_ms']:7.1f} "
                f"{r['intake_per_s'] / other['per_s']:9.2f} {cpu.get(kind, 0):13.3f}"
            )
    pg, lite = results.get("postgres"), results.get("sqlite")
    figures = {
        "intake_vs_bare_view": round(pg["ratio"], 3) if pg else None,
        "intake_vs_bare_view_sqlite": round(lite["ratio"], 3) if lite else None,
        "intake_vs_bare_view_paired": round(pg["paired"], 3) if pg else None,
        "intake_vs_bare_view_paired_sqlite": round(lite["paired"], 3) if lite else None,
        "p50_ms": round(pg["p50_ms"], 1) if pg else None,
        "p99_ms": round(pg["p99_ms"], 1) if pg else None,
        "p50_ms_sqlite": round(lite["p50_ms"], 1) if lite else None,
        "p99_ms_sqlite": round(lite["p99_ms"], 1) if lite else None,
        "intake_vs_bare_view_cpu": cpu_ratio(pg) if pg else None,
        "intake_vs_bare_view_cpu_sqlite": cpu_ratio(lite) if lite else None,
        "cpu_ms": pg["cpu_ms"] if pg else None,
        "cpu_ms_sqlite": lite["cpu_ms"] if lite else None,
        **peer_figures(pg, ""),
        **peer_figures(lite, "_sqlite"),
        "accepted_not_stored": sum(r["accepted_not_stored"] for r in results.values()),
        "non_2xx": sum(n for r in results.values() for s, n in r["answers"].items() if not 200 <= s < 300),
        "quick": args.quick,
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
