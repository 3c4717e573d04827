"""Benchmark: accepted → sent, as a user sees it, against Celery's own hop (issue 23).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> REDIS_URL=redis://127.0.0.1:6379/<n> \\
        .venv/bin/python bench/latency.py [--quick]

It makes a throw-away PostgreSQL database (``lat_<db>``, dropped at the end) with a day of history
(``seed_history``), flushes the Redis database ``REDIS_URL`` names (the bench's own), starts the
counting receiver of the tests as its own process, and for each queue backend (the database queue,
then the Redis queue) a real gunicorn (2 workers × 8 threads, the fleet store) and a real
``manage.py dispatch`` with every setting at its default.
Webhooks go to a GitHub-signed source with one HTTP connector to the receiver. Per queue:

* ``e2e_p50_ms_idle`` / ``e2e_p99_ms_idle`` — from the webhook's 202 (as the client reads it) to
  the receiver's first sight of its command, one webhook at a time with pauses between;
* ``dispatch_per_s`` — commands queued at once (a sweep of approved commands) ÷ the time until
  every one was sent and recorded ``succeeded``: the dispatch throughput of this run;
* ``e2e_p50_ms_half_load`` / ``e2e_p99_ms_half_load`` — the same latency with webhooks sent
  open-loop at half that throughput (``offered_per_s``; ``achieved_per_s`` is what intake took),
  each sender thread on a connection kept alive; ``machine_busy_half_load`` — the share of the
  machine's CPU (every core) busy meanwhile: near 1, intake, dispatch, the receiver and this
  load generator together are what the machine can carry; ``half_load_cpu_ms`` — where it went,
  CPU ms per webhook (one command each) of each process kind: ``intake`` (gunicorn's workers),
  ``dispatch``, ``postgresql`` and ``redis`` (every process of the server, whoever it serves),
  ``receiver``, ``load`` (this process); ``machine_carries_per_s`` — the webhooks/s the machine's
  cores would carry at what each cost in that phase (all those kinds together): where it is below
  ``offered_per_s``, the rate offered is more than this machine can run end to end;
  ``site_carries_per_s`` — the same without the receiver and the load, which a deployment runs
  elsewhere: the site's own processes alone on these cores;
* ``e2e_p50_ms_site_half_load`` / ``e2e_p99_ms_site_half_load`` — when intake could not take the
  rate offered (``achieved_per_s`` below ``SATURATED`` of ``offered_per_s``: the machine was
  full), the same latency once more at half of what it took (``site_half_load_per_s``), with
  ``machine_busy_site_half_load``: the tail of a machine half loaded end to end, where the issue's
  rate loads the dispatcher half and the machine wholly; all four null when it took the rate;
* ``celery_hop_p50_ms`` — the anchor, measured once in the same run: ``apply_async`` of an empty
  task → the task starts, a Celery worker (``--pool solo``, the site's settings:
  ``bench/celery_hop.py``) on the same Redis, one task at a time with pauses between;
* ``e2e_vs_celery_hop_p50`` = ``e2e_p50_ms_idle`` ÷ ``celery_hop_p50_ms``. Targets: ≤ 2.0, and
  ``e2e_p99_ms_half_load`` ≤ 250, on both queues.

The database queue's figures are top-level keys, the Redis queue's the same keys inside
``"redis_queue"``. ``--quick`` makes every phase short (a smoke test, not a measurement);
``--web-nice N`` lowers gunicorn's priority (its workers wait for a core behind the dispatcher,
PostgreSQL and the receiver), to see what the machine's cores cost the latency. ``--engine celery``
sends with Celery instead of the loop, as deploy/Procfile runs it (a worker's prefork pool of 16
and beat, ``ANKUSA_DISPATCH_CELERY_WAKE`` on): the same keys, and ``"engine": "celery"``. Prints a
table, then one JSON line.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")
os.environ.setdefault("SECRET_KEY", "bench-only-not-a-secret-" + "x" * 32)
os.environ.setdefault("ANKUSA_CONNECTOR_ALLOWED_NETWORKS", "127.0.0.0/8")

import django  # noqa: E402

django.setup()

import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

from commands.dispatch.sweep import sweep  # noqa: E402
from commands.models import Command, Connector, Delivery, Source  # noqa: E402
from limits.models import Tenant  # noqa: E402
from tests.commands.conftest import HOOK_SECRET, github_headers  # noqa: E402
from tests.commands.sink import ReceiverProcess  # noqa: E402
from tests.servers import BODY, Node, wait_for  # noqa: E402
from tests.services import database_url  # noqa: E402

HOPS = "bench:celery_hop:started"  # bench/celery_hop.py's list


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def machine_busy() -> tuple[float, float]:
    """The machine's busy and total CPU ticks so far, every core (``/proc/stat``: all but idle and
    iowait)."""
    with open("/proc/stat") as stat:
        ticks = [int(n) for n in stat.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def busy_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share of the machine's CPU busy between two ``machine_busy()`` readings."""
    return round((after[0] - before[0]) / max(1, after[1] - before[1]), 2)


def _stat(pid) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state first, so ``man proc``'s
    field n is at n - 3). Raises ``OSError`` for a process that is gone."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def process_cpu(pids) -> float:
    """CPU seconds (user and system) the processes ``pids`` used so far; those gone count 0."""
    total = 0
    for pid in pids:
        try:
            fields = _stat(pid)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def server_cpu(postmaster: int) -> float:
    """CPU seconds the PostgreSQL server whose postmaster is ``postmaster`` used so far: its own, its
    live children's and, through the postmaster's ``cutime`` and ``cstime``, those of the children
    it has reaped. A difference of two readings counts the backends that ended in between (a
    closed connection's), which a sum over the live processes would miss or subtract, and no
    other server on the machine."""
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(_stat(pid)[1]) == postmaster:  # its parent
                children.append(int(pid))
        except OSError:
            continue
    reaped = _stat(postmaster)
    reaped_s = (int(reaped[13]) + int(reaped[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
    return process_cpu([postmaster, *children]) + reaped_s


def postmaster_of(connection) -> int:
    """The pid of the postmaster behind a Django ``connection`` (its backend's parent)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    return int(_stat(backend)[1])


def named(command: str) -> list[int]:
    """The pids whose command name (``/proc/<pid>/comm``) is ``command``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as comm:
                if comm.read().strip() == command:
                    found.append(int(pid))
        except OSError:
            continue
    return found


def renice(pids: list[int], niceness: int) -> None:
    """Set the niceness of every thread of ``pids`` (Linux sets it per thread; threads started
    later inherit their starter's)."""
    for pid in pids:
        for task in os.listdir(f"/proc/{pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(task), niceness)


# Intake took less than this share of the rate offered: the machine could not carry the loaded
# phase, and what intake took is what the whole site sustains on it.
SATURATED = 0.95


# The process kinds of half_load_cpu_ms that are the benchmark's, not the site's.
BENCH_KINDS = ("receiver", "load")


def carried_per_s(cpu_ms: dict[str, float], cores: int) -> float | None:
    """Webhooks/s ``cores`` would carry, each costing the CPU milliseconds of ``cpu_ms`` (one
    figure per process kind) together; None without a figure."""
    total = sum(cpu_ms.values())
    return round(1000 * cores / total, 1) if total > 0 else None


def site_half_rate(offered: float, achieved: float) -> float | None:
    """Half of what the site took in, when it could not take what was offered; else None (the
    loaded phase already left the machine room)."""
    return achieved / 2 if achieved < SATURATED * offered else None


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def children(pid: int) -> list[int]:
    """The processes ``pid`` forked (a Celery worker's pool), none once it is gone."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as found:
            return [int(child) for child in found.read().split()]
    except OSError:
        return []


def dispatch_commands(engine: str, backend: str, log_dir: Path) -> list[list[str]]:
    """The processes that send, as deployed (deploy/Procfile): the loop, or a Celery worker (the
    prefork pool, 16 processes) and beat."""
    if engine == "loop":
        return [[sys.executable, "manage.py", "dispatch"]]
    celery = [sys.executable, "-m", "celery", "-A", "ankusa_site"]
    return [
        [*celery, "worker", "--concurrency", "16", "--loglevel", "INFO"],
        [*celery, "beat", "--schedule", str(log_dir / f"beat-schedule-{backend}"), "--pidfile", ""],
    ]


class Run:
    """One queue backend's gunicorn and dispatcher (the loop, or Celery's worker and beat), and the
    webhooks sent to them."""

    def __init__(self, backend: str, env: dict, sink: ReceiverProcess, log_dir: Path, engine: str = "loop"):
        self.backend = backend
        self.sink = sink
        self.env = {**env, "ANKUSA_QUEUE_BACKEND": backend}
        if engine == "celery":  # a commit that queues asks for the poll task, on the site and workers
            self.env["ANKUSA_DISPATCH_CELERY_WAKE"] = "1"
        self.node = Node(self.env, log_dir / f"gunicorn-{backend}.log", workers=2, threads=8)
        self.dispatch_log = open(log_dir / f"dispatch-{backend}.log", "wb")  # its drain lines
        # The loop logs a line a send (left out); Celery's worker and beat log their tasks' ends.
        stderr = subprocess.DEVNULL if engine == "loop" else subprocess.STDOUT
        self.dispatchers = [
            subprocess.Popen(command, cwd=BASE_DIR, env=self.env, stdout=self.dispatch_log, stderr=stderr)
            for command in dispatch_commands(engine, backend, log_dir)
        ]
        self.sent = 0
        self.lock = threading.Lock()

    def hook(self, conn: http.client.HTTPConnection | None = None) -> tuple[list[int], float]:
        """One webhook (on ``conn``, kept alive, if given); the ids of its commands and when its
        202 was read (``time.time()``)."""
        with self.lock:
            self.sent += 1
            delivery = f"{self.backend}-{self.sent}-{random.random()}"
        if conn is None:
            status, body, _ = self.node.hook(delivery, BODY)
        else:
            headers = {"Content-Type": "application/json", **github_headers(BODY, delivery)}
            conn.request("POST", "/hooks/acme/orders/", body=BODY, headers=headers)
            response = conn.getresponse()
            status, body = response.status, json.loads(response.read())
        answered = time.time()
        if status != 202:
            raise SystemExit(f"{self.backend}: a webhook got {status}: {body}")
        return body["commands"], answered

    def latencies(self, answered: dict[int, float], timeout: float = 60) -> list[float]:
        """Seconds from each command's 202 to the receiver's first sight of it."""
        keys = {str(pk) for pk in answered}
        since = min(answered.values(), default=0.0) - 5  # a send may arrive before its 202 is read

        def arrived() -> dict | None:
            found = self.sink.stats("times", after=since)
            return found if keys <= found.keys() else None

        times = wait_for(arrived, timeout=timeout, what=f"{len(keys)} commands at the receiver")
        return [times[str(pk)] - at for pk, at in answered.items()]

    def idle(self, n: int) -> list[float]:
        answered = {}
        for _ in range(n):
            ids, at = self.hook()
            answered.update(dict.fromkeys(ids, at))
            self.latencies(dict.fromkeys(ids, at), timeout=30)  # arrived: the next one starts idle
            time.sleep(random.uniform(0.2, 0.4))
        return self.latencies(answered)

    def throughput(self, connector: Connector, n: int) -> float:
        """Commands/s from a sweep that queues ``n`` at once until every one is sent and recorded
        ``succeeded`` (what the dispatcher sustains: the receiver has them sooner)."""
        tenant = connector.tenant
        made = Command.objects.bulk_create(
            [Command(tenant=tenant, connector=connector, payload={"order": i}) for i in range(n)],
            batch_size=1000,
        )
        settings.ANKUSA_QUEUE_BACKEND = self.backend  # this process's sweep queues where they look
        # and under Celery asks for the poll, as the site's sweeps do
        settings.ANKUSA_DISPATCH_CELERY_WAKE = "ANKUSA_DISPATCH_CELERY_WAKE" in self.env
        started = time.time()
        sweep()
        ids = [command.pk for command in made]
        wait_for(
            lambda: not Command.objects.filter(pk__gte=min(ids)).exclude(state="succeeded").exists(),
            timeout=300,
            what="the burst to be sent and recorded",
        )
        recorded = time.time()
        self.latencies(dict.fromkeys(ids, started), timeout=60)  # and the receiver has each
        return n / (recorded - started)

    def load(self, per_s: float, seconds: float, threads: int = 16) -> tuple[list[float], float]:
        """Webhooks open-loop at ``per_s`` for ``seconds``: their latencies, and the rate achieved."""
        total = max(1, round(per_s * seconds))
        slots = iter(range(total))
        answered: dict[int, float] = {}
        lock = threading.Lock()
        start = time.monotonic() + 0.2

        def send() -> None:
            # A connection kept alive per thread, as a busy provider keeps one: the load costs
            # this process and gunicorn no connection a webhook.
            conn = http.client.HTTPConnection("127.0.0.1", self.node.port, timeout=30)
            try:
                while True:
                    with lock:
                        slot = next(slots, None)
                    if slot is None:
                        return
                    time.sleep(max(0.0, start + slot / per_s - time.monotonic()))
                    ids, at = self.hook(conn)
                    with lock:
                        answered.update(dict.fromkeys(ids, at))
            finally:
                conn.close()

        workers = [threading.Thread(target=send) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        achieved = total / (time.monotonic() - start)
        return self.latencies(answered, timeout=120), achieved

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each process kind the loaded phase runs (``half_load_cpu_ms``)."""
        return {
            "intake": process_cpu(self.node.workers()),
            "dispatch": process_cpu(
                [pid for one in self.dispatchers for pid in (one.pid, *children(one.pid))]
            ),
            "postgresql": server_cpu(postmaster_of(connection)),
            "redis": process_cpu(named("redis-server")),
            "receiver": process_cpu([self.sink.process.pid]),
            "load": process_cpu([os.getpid()]),
        }

    def stop(self) -> None:
        for dispatcher in self.dispatchers:
            dispatcher.terminate()
        for dispatcher in self.dispatchers:
            dispatcher.wait(timeout=60)
        self.dispatch_log.close()
        self.node.stop()


def seed_history(tenant: Tenant, source: Source, connector: Connector, n: int) -> None:
    """Deliveries and their commands, sent long ago, then ``ANALYZE``: the run measures a site that
    has been in use. On tables a minute old, PostgreSQL plans a lookup by key as a scan of the
    whole table (cheaper while the table is a page), and long-lived connections keep those plans
    until autovacuum analyzes the table (about a minute): the run would measure that minute."""
    long_ago = timezone.now() - timedelta(days=1)
    deliveries = Delivery.objects.bulk_create(
        [
            Delivery(
                tenant=tenant, source=source, event_key=f"past-{i}", body="{}", size=2, received_at=long_ago
            )
            for i in range(n)
        ],
        batch_size=2000,
    )
    Command.objects.bulk_create(
        [
            Command(tenant=tenant, connector=connector, source=source, delivery=delivery, payload={},
                    state="succeeded", attempts=1)
            for delivery in deliveries
        ],
        batch_size=2000,
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def celery_hops(env: dict, n: int, log_dir: Path) -> list[float]:
    """Seconds from ``apply_async`` of an empty task to its start, one at a time with pauses."""
    from bench.celery_hop import hop

    client = redis.Redis.from_url(env["REDIS_URL"], socket_timeout=90)
    with open(log_dir / "celery.log", "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.celery_hop", "worker", "--pool", "solo",
             "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "warning"],
            cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            hops = []
            for number in range(n + 3):  # the first three warm the worker up
                sent = time.time()
                hop.apply_async(args=[number])
                found = client.blpop([HOPS], timeout=60)
                if found is None:
                    raise SystemExit(f"the Celery worker did not start a task: see {log_dir / 'celery.log'}")
                if number >= 3:
                    hops.append(float(found[1].split()[1]) - sent)
                time.sleep(random.uniform(0.2, 0.4))
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    return hops


def table(figures: dict) -> list[str]:
    """The run's figures as rows, the database queue's beside the Redis queue's.

    A key one queue lacks, or holds as null (a phase that did not run there), shows as "-".
    """
    redis_figures = figures.get("redis_queue", {})

    def cell(value) -> str:
        return "-" if value is None else str(value)

    rows = [f"{'measure':<30}{'database':>12}{'redis':>12}"]
    for key in [k for k in dict.fromkeys((*figures, *redis_figures)) if k not in ("redis_queue", "quick")]:
        database, other = figures.get(key), redis_figures.get(key)
        if isinstance(database, dict) or isinstance(other, dict):  # one row per part
            database, other = (value if isinstance(value, dict) else {} for value in (database, other))
            for part in dict.fromkeys((*database, *other)):
                row = f"{key}.{part}"
                rows.append(f"{row:<30}{cell(database.get(part)):>12}{cell(other.get(part)):>12}")
        else:
            rows.append(f"{key:<30}{cell(database):>12}{cell(other):>12}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases (a smoke test, not a measurement)")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="webhooks/s of the loaded phase (default: half the throughput)",
    )
    parser.add_argument(
        "--queues", default="database,redis", help="the queue backends to run, in order (default: both)"
    )
    parser.add_argument(
        "--engine",
        choices=("loop", "celery"),
        default="loop",
        help="what sends: manage.py dispatch (default), or a Celery worker and beat as deployed",
    )
    parser.add_argument(
        "--web-nice",
        type=int,
        default=0,
        help="the niceness of gunicorn's processes (default 0, as the dispatcher's): who waits for a core",
    )
    args = parser.parse_args()
    idle_n, burst_n, load_s, hops_n = (8, 300, 2.0, 8) if args.quick else (40, 3000, 15.0, 40)
    history_n = 1000 if args.quick else 20000

    db = settings.DATABASES["default"]
    if not db["ENGINE"].endswith("postgresql"):
        raise SystemExit("latency measures PostgreSQL: set DATABASE_URL to a postgres:// URL")
    db.setdefault("TEST", {})["NAME"] = f"lat_{db['NAME']}"
    redis.Redis.from_url(settings.REDIS_URL).flushdb()  # the bench's own database number
    old_config = setup_databases(verbosity=0, interactive=False)
    log_dir = Path(os.environ.get("BENCH_LOG_DIR", "/tmp")) / f"latency-{os.getpid()}"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "ankusa_site.settings",
        "DATABASE_URL": database_url(settings.DATABASES["default"]),
        "REDIS_URL": settings.REDIS_URL,
        "ANKUSA_STORE_SCOPE": "fleet",
        "PYTHONPATH": str(BASE_DIR),
    }
    sink = ReceiverProcess(cwd=BASE_DIR, timeout=10)
    figures: dict = {}
    try:
        tenant = Tenant.objects.create(slug="acme", name="Acme")
        connector = Connector.objects.create(
            tenant=tenant, name="receiver", kind="http", url=sink.url, idempotent=True
        )
        source = Source.objects.create(
            tenant=tenant,
            slug="orders",
            verifier="github",
            verifier_secrets=[HOOK_SECRET],
            dedupe_key="github",
            dedupe_body=False,  # one body under many delivery ids
        )
        source.connectors.set([connector])
        seed_history(tenant, source, connector, history_n)
        hop_p50 = statistics.median(celery_hops(env, hops_n, log_dir))
        for backend in args.queues.split(","):
            run = Run(backend, env, sink, log_dir, args.engine)
            try:
                run.idle(5)  # warm-up: connections, caches, prepared statements
                if args.web_nice:
                    renice([run.node.process.pid, *run.node.workers()], args.web_nice)
                idle = run.idle(idle_n)
                per_s = run.throughput(connector, burst_n)
                offered = args.rate or per_s / 2
                busy_before, cpu_before = machine_busy(), run.cpu()
                loaded, achieved = run.load(offered, load_s)
                busy_after, cpu_after = machine_busy(), run.cpu()
                site_rate, site_loaded, site_busy = site_half_rate(offered, achieved), None, None
                if site_rate is not None:
                    before = machine_busy()
                    site_loaded, _ = run.load(site_rate, load_s)
                    site_busy = busy_share(before, machine_busy())
            finally:
                run.stop()
            cores = os.cpu_count() or 1
            cpu_ms = {
                kind: round(1000 * (cpu_after[kind] - cpu_before[kind]) / len(loaded), 2)
                for kind in cpu_after
            }
            site_ms = (None, None)
            if site_loaded is not None:
                site_ms = (ms(statistics.median(site_loaded)), ms(percentile(site_loaded, 0.99)))
            result = {
                "e2e_p50_ms_idle": ms(statistics.median(idle)),
                "e2e_p99_ms_idle": ms(percentile(idle, 0.99)),
                "e2e_p50_ms_half_load": ms(statistics.median(loaded)),
                "e2e_p99_ms_half_load": ms(percentile(loaded, 0.99)),
                "celery_hop_p50_ms": ms(hop_p50),
                "e2e_vs_celery_hop_p50": round(statistics.median(idle) / hop_p50, 2),
                "dispatch_per_s": round(per_s, 1),
                "offered_per_s": round(offered, 1),
                "achieved_per_s": round(achieved, 1),
                "machine_busy_half_load": busy_share(busy_before, busy_after),
                "half_load_cpu_ms": cpu_ms,
                "machine_carries_per_s": carried_per_s(cpu_ms, cores),
                "site_carries_per_s": carried_per_s(
                    {kind: cost for kind, cost in cpu_ms.items() if kind not in BENCH_KINDS}, cores
                ),
                "site_half_load_per_s": None if site_rate is None else round(site_rate, 1),
                "e2e_p50_ms_site_half_load": site_ms[0],
                "e2e_p99_ms_site_half_load": site_ms[1],
                "machine_busy_site_half_load": site_busy,
                "idle_n": len(idle),
                "half_load_n": len(loaded),
            }
            if backend == "database":
                figures.update(result)
            else:
                figures["redis_queue"] = result
    finally:
        sink.stop()
        connection.close()
        teardown_databases(old_config, verbosity=0)
    figures["quick"] = args.quick
    if args.engine != "loop":
        figures["engine"] = args.engine
    if args.web_nice:
        figures["web_nice"] = args.web_nice
    print("\n".join(table(figures)))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
