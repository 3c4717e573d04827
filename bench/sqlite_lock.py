"""Benchmark: write transactions/s on one SQLite file, the site's backend (``ankusa_site.sqlite3``:
a process's threads take turns, then wait for the write lock in short steps) over Django's own
(waiting in SQLite's busy handler).

    .venv/bin/python bench/sqlite_lock.py [--processes 2] [--threads 4] [--work-us 500]
        [--seconds 3] [--rounds 4]

Both run the same work on the same kind of file (WAL, ``BEGIN IMMEDIATE``, the 20 s timeout: what
``DATABASE_URL=sqlite:///…`` gives): ``--processes`` processes of ``--threads`` threads, each
spending ``--work-us`` of CPU (a request's own work; 500 µs is about a webhook's) and then
committing a transaction shaped like the intake's on SQLite (a delivery, a command, a queue item:
three inserts and the queue's tail read), again and again. ``--work-us 0`` writes without pause.
Rounds of the two alternate, so both share the machine's moods; each kind's best round is kept.
A writer that fails fails the run. The last line is JSON: ``sqlite_steps_vs_busy_handler`` (the
site's commits/s ÷ Django's), and each one's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

ENGINES = {"busy_handler": "django.db.backends.sqlite3", "steps": "ankusa_site.sqlite3"}
SCHEMA = [
    "CREATE TABLE delivery (id INTEGER PRIMARY KEY, body TEXT NOT NULL)",
    "CREATE TABLE command (id INTEGER PRIMARY KEY, delivery_id INTEGER NOT NULL REFERENCES delivery (id),"
    " payload TEXT NOT NULL)",
    "CREATE TABLE item (id INTEGER PRIMARY KEY, position INTEGER NOT NULL UNIQUE, payload TEXT NOT NULL)",
]
BODY = '{"order": "A-1", "action": "ship", "lines": [1, 2, 3]}'


def spin(seconds: float) -> None:
    """Hold the interpreter for ``seconds`` of CPU, as a request's own work outside the write does."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def child(engine: str, path: str, threads: int, start_at: float, seconds: float, work_s: float) -> None:
    """One process: ``threads`` writers from ``start_at`` for ``seconds``; prints its commits."""
    import django
    from django.conf import settings

    from ankusa_site.core.env import parse_database_url

    database = parse_database_url("DATABASE_URL", f"sqlite:///{path}", base_dir=BASE_DIR)
    settings.configure(DATABASES={"default": {**database, "ENGINE": engine}}, USE_TZ=True)
    django.setup()
    from django.db import connection, transaction

    commits = [0] * threads
    failures = []

    def write(slot: int) -> None:
        try:
            run(slot)
        except Exception as exc:  # noqa: BLE001 - any failure fails the run, below
            failures.append(f"{type(exc).__name__}: {exc}")

    def run(slot: int) -> None:
        time.sleep(max(0.0, start_at - time.time()))
        end = start_at + seconds
        while time.time() < end:
            spin(work_s)
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("INSERT INTO delivery (body) VALUES (%s) RETURNING id", [BODY])
                (delivery,) = cursor.fetchone()
                cursor.execute(
                    "INSERT INTO command (delivery_id, payload) VALUES (%s, %s) RETURNING id",
                    [delivery, BODY],
                )
                (command,) = cursor.fetchone()
                cursor.execute("SELECT MAX(position) FROM item")
                (last,) = cursor.fetchone()
                cursor.execute(
                    "INSERT INTO item (position, payload) VALUES (%s, %s)",
                    [(last or 0) + 1, json.dumps({"command": command, "attempt": 1})],
                )
            commits[slot] += 1
        connection.close()

    workers = [threading.Thread(target=write, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise SystemExit(f"{len(failures)} writer(s) failed: {failures[0]}")
    print(sum(commits))


def one_round(kind: str, path: Path, args) -> float:
    start_at = time.time() + 1.0  # every process started and waiting when the clock starts
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--child",
                ENGINES[kind],
                str(path),
                str(args.threads),
                repr(start_at),
                str(args.seconds),
                str(args.work_us / 1e6),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(BASE_DIR)},
        )  # fmt: skip
        for _ in range(args.processes)
    ]
    commits = 0
    for process in processes:
        out, _ = process.communicate(timeout=args.seconds + 60)
        if process.returncode != 0:
            raise SystemExit(f"a {kind} writer failed (exit {process.returncode})")
        commits += int(out.strip().splitlines()[-1])
    return commits / args.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--work-us", type=float, default=500, help="CPU each writer spends outside each transaction (µs)"
    )
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        engine, path, threads, start_at, seconds, work_s = args.child
        child(engine, path, int(threads), float(start_at), float(seconds), float(work_s))
        return

    import sqlite3

    best = dict.fromkeys(ENGINES, 0.0)
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-lock-") as folder:
        for round_number in range(args.rounds):
            for kind in ENGINES:  # a fresh file per round and kind: the same sizes for both
                path = Path(folder) / f"{kind}-{round_number}.sqlite3"
                with sqlite3.connect(path) as setup:
                    setup.execute("PRAGMA journal_mode=WAL")
                    for statement in SCHEMA:
                        setup.execute(statement)
                rate = one_round(kind, path, args)
                best[kind] = max(best[kind], rate)
                print(f"  round {round_number + 1}: {kind:12} {rate:8,.0f} commits/s", flush=True)
    ratio = best["steps"] / best["busy_handler"]
    print(
        f"\n{args.processes} processes x {args.threads} threads, {args.work_us:g} µs of work outside each "
        f"transaction, {args.rounds} alternating rounds of "
        f"{args.seconds:g} s, best kept: the site's backend {best['steps']:,.0f}/s, Django's "
        f"{best['busy_handler']:,.0f}/s"
    )
    print(
        json.dumps(
            {
                "sqlite_steps_vs_busy_handler": round(ratio, 3),
                "commits_per_s": {kind: round(rate) for kind, rate in best.items()},
                "work_us": args.work_us,
                "processes": args.processes,
                "threads": args.threads,
            }
        )
    )


if __name__ == "__main__":
    main()
