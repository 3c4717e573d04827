"""Benchmark: Python bytecode instructions a webhook costs, over what the bare Django view costs, in
one process with the same requests as ``bench/intake.py``.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python bench/intake_ops.py
        [--only postgres|sqlite] [--requests 200]

Why: on a shared two-core machine the throughput ratio of ``bench/intake.py`` moves by more than
a change to the intake's code moves it, so a change of a few percent cannot be seen there. The
count of bytecode instructions the interpreter runs per request does not depend on the machine's
load (it is the same from run to run for the same code and requests), and the interpreter is where
most of the machine's CPU goes under the intake benchmark (``perf``; bench/README.md). It does not count time in C (``json``, ``hmac``, the drivers), in PostgreSQL or in
Redis, nor the cost of waiting for them: it tells whether Python work went up or down, and where.

Each set-up runs on its own throw-away database (as ``bench/intake.py``: PostgreSQL with the fleet
store, SQLite with the local store) and counts, in a child process, ``--requests`` of each kind
after a warm-up, through the site's WSGI handler (its middleware included, gunicorn excluded):
the bare view and a GitHub-signed webhook, each with its own delivery id. The last line is JSON:
``opcodes_bare``, ``opcodes_webhook`` and ``intake_vs_bare_view_opcodes`` (bare ÷ webhook) per
set-up, and where a webhook's instructions go (``webhook_parts``: the view's own callees, and the
framework around it).

Before counting, untraced, it also times the child's own CPU per request (``time.process_time``:
its threads and the kernel's work for it, not PostgreSQL's or Redis'), in 5 alternating blocks of
``--requests`` of each kind: ``cpu_us_bare``, ``cpu_us_webhook`` (medians) and
``intake_vs_bare_view_inprocess_cpu`` (bare ÷ webhook) — what a request costs one worker with no
gunicorn, no other threads and no waiting for the GIL, so the rest of a webhook's cost under the
benchmark is the servers', the wake-ups' and the contention's.

On PostgreSQL with the fleet store a third kind joins those blocks: the same webhooks with their
round trips answered by what the real ones answered during the warm-up (``bench/replay.py``: the
store's claim, the settles riding on it, and the statement) —
``cpu_us_webhook_without_round_trips``: what a webhook costs the worker beyond its waits on Redis
and PostgreSQL (the sockets, the drivers, the wake-ups), which the order claim, commit, answer
fixes at two.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.intake import BODY, prepare, python, run_setups, signature  # noqa: E402

VIEWS = {"receive": "hooks.py", "bare": "intake_server.py"}
# Untraced blocks of ``--requests`` of each kind, alternating, for the CPU per request.
CPU_BLOCKS = 5


def count(name: str, env: dict, args) -> dict:
    """A set-up's figures, counted by a child process on the database ``env`` names."""
    tenant = prepare(env)
    # Tracing slows the child down a hundredfold: no re-read of the kept route, no store timeout.
    env = {**env, "ANKUSA_INTAKE_CACHE_S": "3600", "ANKUSA_STORE_TIMEOUT_MS": "10000"}
    output = python(
        env, __file__, "--child", "--requests", str(args.requests), stdin=tenant, what=f"{name}: counting"
    )
    figures = json.loads(output.strip().splitlines()[-1])
    return figures


def child(requests: int) -> None:
    import secrets

    import django

    django.setup()
    from bench.intake_server import application

    tenant = sys.stdin.read().strip()
    body = BODY.encode()
    signed = signature(body)
    answers = Counter()

    def environ(path: str, headers: dict) -> dict:
        return {
            "REQUEST_METHOD": "POST", "PATH_INFO": path, "SCRIPT_NAME": "", "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "127.0.0.1:8000", "CONTENT_TYPE": "application/json",
            "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body), "wsgi.url_scheme": "http",
            "wsgi.errors": sys.stderr, "wsgi.multithread": True, "wsgi.multiprocess": True,
            "wsgi.run_once": False, **headers,
        }  # fmt: skip

    def bare() -> dict:
        return environ("/bench/bare/", {})

    def webhook() -> dict:
        return environ(
            f"/hooks/{tenant}/orders/",
            {
                "HTTP_X_GITHUB_EVENT": "push",
                "HTTP_X_GITHUB_DELIVERY": secrets.token_hex(16),
                "HTTP_X_HUB_SIGNATURE_256": signed,
            },
        )

    def start_response(status, headers, exc_info=None):
        answers[status.split()[0]] += 1

    def serve(environs: list[dict]) -> None:
        for one in environs:
            response = application(one, start_response)
            b"".join(response)
            response.close()

    def counted(make) -> tuple[int, Counter]:
        parts = Counter()

        def trace(frame, event, arg):  # on each call: which part the new frame's instructions are
            frame.f_trace_opcodes = True
            part = _part(frame)

            def each(frame, event, arg):
                if event == "opcode":
                    parts[part] += 1
                return each

            return each

        environs = [make() for _ in range(requests)]
        sys.settrace(trace)
        try:
            serve(environs)
        finally:
            sys.settrace(None)
        return sum(parts.values()), parts

    def cpu_us(make) -> float:
        """This process's CPU per request (all its threads, kernel included), not traced."""
        environs = [make() for _ in range(requests)]
        started = time.process_time()
        serve(environs)
        return (time.process_time() - started) / requests * 1e6

    for make in (bare, webhook):  # warm-up: imports, caches, prepared statements, the kept route
        serve([make() for _ in range(50)])
    replay = recorded_round_trips(lambda: serve([webhook() for _ in range(5)]))
    timed = {"bare": [], "webhook": []}
    if replay is not None:
        timed["without_round_trips"] = []
    for _ in range(CPU_BLOCKS):  # alternating, so both kinds share the machine's moods
        timed["bare"].append(cpu_us(bare))
        timed["webhook"].append(cpu_us(webhook))
        if replay is not None:
            with replay():
                timed["without_round_trips"].append(cpu_us(webhook))
    answers.clear()
    bare_total, _ = counted(bare)
    webhook_total, parts = counted(webhook)
    print(
        json.dumps(
            {
                "opcodes_bare": round(bare_total / requests),
                "opcodes_webhook": round(webhook_total / requests),
                "cpu_us_bare": round(statistics.median(timed["bare"])),
                "cpu_us_webhook": round(statistics.median(timed["webhook"])),
                **(
                    {
                        "cpu_us_webhook_without_round_trips": round(
                            statistics.median(timed["without_round_trips"])
                        )
                    }
                    if replay is not None
                    else {}
                ),
                "answers": dict(answers),
                "webhook_parts": {part: round(n / requests) for part, n in parts.most_common()},
            }
        )
    )


def recorded_round_trips(send):
    """On PostgreSQL with the fleet store: a context manager under which the store's calls and the
    intake's statement answer what they answered while ``send`` ran (``bench/replay.py``), without
    reaching Redis or PostgreSQL (their Python around the socket stays). None on any other set-up."""
    from django.conf import settings
    from django.db import connection

    from bench.replay import replaying
    from limits.store import settling

    if connection.vendor != "postgresql" or settings.ANKUSA_STORE_SCOPE != "fleet":
        return None
    with replaying():  # records each kind of round trip the first time it is made
        send()
        settling.RETRIER.flush()  # the settles made after the answers, recorded too
    return replaying


def _part(frame) -> str:
    """What a webhook's instruction is part of: the callee of the view (``submit`` one level down)
    it runs under, or ``framework`` outside the view."""
    chain = []
    while frame is not None:
        chain.append(frame.f_code)
        frame = frame.f_back
    chain.reverse()
    for index, code in enumerate(chain):
        if VIEWS.get(code.co_name) == Path(code.co_filename).name:
            below = chain[index + 1 : index + 3]
            if not below:
                return "view itself"
            if below[0].co_name == "submit" and len(below) > 1:
                return f"submit > {below[1].co_name}"
            return below[0].co_name
    return "framework"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["postgres", "sqlite"])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.requests)
        return

    results = run_setups(args, count)

    figures = {}
    for name, r in results.items():
        ratio = r["opcodes_bare"] / r["opcodes_webhook"]
        print(
            f"\n{name}: bare view {r['opcodes_bare']:,} opcodes a request, webhook {r['opcodes_webhook']:,}"
        )
        print(
            f"  this process's CPU a request, untraced: bare view {r['cpu_us_bare']:,} µs,"
            f" webhook {r['cpu_us_webhook']:,} µs"
        )
        if "cpu_us_webhook_without_round_trips" in r:
            print(
                f"  a webhook with its round trips answered from a recording: "
                f"{r['cpu_us_webhook_without_round_trips']:,} µs"
            )
        print(f"  answers {r['answers']}; where a webhook's go:")
        for part, n in r["webhook_parts"].items():
            print(f"  {n:8,}  {part}")
        suffix = "" if name == "postgres" else f"_{name}"
        figures |= {
            f"opcodes_bare{suffix}": r["opcodes_bare"],
            f"opcodes_webhook{suffix}": r["opcodes_webhook"],
            f"intake_vs_bare_view_opcodes{suffix}": round(ratio, 3),
            f"cpu_us_bare{suffix}": r["cpu_us_bare"],
            f"cpu_us_webhook{suffix}": r["cpu_us_webhook"],
            f"intake_vs_bare_view_inprocess_cpu{suffix}": round(r["cpu_us_bare"] / r["cpu_us_webhook"], 3),
            **(
                {f"cpu_us_webhook_without_round_trips{suffix}": r["cpu_us_webhook_without_round_trips"]}
                if "cpu_us_webhook_without_round_trips" in r
                else {}
            ),
            f"answers{suffix}": r["answers"],
        }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
