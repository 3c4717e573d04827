"""Benchmark: the machine's CPU per webhook under two gunicorn settings modules, served side by side
and measured in alternating rounds of one run, and the ratio of the two.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python bench/intake_ab.py [--quick]
        [--only postgres|sqlite] [--baseline bench.gunicorn_unfrozen]
        [--candidate ankusa_site.gunicorn_conf]

Why: on a shared two-core machine the throughput ratio of ``bench/intake.py`` moves with the
machine's load by more than a change of a few percent, so a change to how the server runs cannot be
seen there. Here two gunicorn servers run at once on the same throw-away database and store (the
set-ups of ``bench/intake.py``), one per settings module, and this process drives them in turns:
a round of bare requests and a round of webhooks on the baseline, the same on the candidate, and
again, ``--rounds`` times. Neighbouring rounds share the machine's load, and the median of each
server's CPU per request (read from ``/proc`` around each round, the whole machine) compares them.

By default it compares the deployed settings (``ankusa_site.gunicorn_conf``, whose workers freeze
what they loaded out of the garbage collector's sight) with the same settings without the freeze
(``bench/gunicorn_unfrozen.py``). ``--baseline bench.gunicorn_django_handler`` compares the site's
handler (webhooks take a shortcut past the URL resolver and most middleware,
``ankusa_site.handlers``) with Django's own; ``--baseline bench.gunicorn_stock_worker`` the site's
gunicorn worker (``ankusa_site.gunicorn_worker``: a new connection only while a thread is free)
with gunicorn's own ``gthread``.

The last line is JSON, per set-up (``_sqlite`` for SQLite): ``cpu_ms_webhook`` and ``cpu_ms_bare``
(median machine CPU per request, for ``baseline`` and ``candidate``),
``webhook_cpu_candidate_vs_baseline`` (the candidate's median over the baseline's: below 1, a
webhook costs the machine less under the candidate), the same for the bare view; ``webhook_per_s``
and ``bare_per_s`` (median requests per second) and ``…_per_s_candidate_vs_baseline`` (above 1,
the candidate serves more); ``lopsided_rounds`` (of each server and kind, the rounds in which one
worker held more than its share of the client's connections, read from ``/proc`` at half the
round); and ``accepted_not_stored`` over every round (must be 0).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.intake import (  # noqa: E402
    ANALYZE,
    CHECK,
    Server,
    manage,
    one_round,
    parse_rounds,
    prepare,
    rounds_parser,
    run_setups,
    warm_up,
)


def measure(name: str, env: dict, args) -> dict:
    tenant = prepare(env)
    servers = {role: Server(env, args.workers, args.threads, config) for role, config in args.variants}
    accepted = []
    cpu = {role: {"bare": [], "webhook": []} for role in servers}
    rate = {role: {"bare": [], "webhook": []} for role in servers}
    # Rounds in which one worker held more of the connections than its share (rounded up).
    fair = -(-args.concurrency // args.workers)
    lopsided = {role: {"bare": 0, "webhook": 0} for role in servers}
    try:
        for server in servers.values():
            warm_up(server, tenant, args.concurrency)
        manage(env, "shell", "-c", ANALYZE)
        for _ in range(args.rounds):
            for role, server in servers.items():
                bare, intake = one_round(server, tenant, args)
                accepted += intake["accepted"]
                cpu[role]["bare"].append(bare["cpu_ms"]["machine"])
                cpu[role]["webhook"].append(intake["cpu_ms"]["machine"])
                rate[role]["bare"].append(bare["per_s"])
                rate[role]["webhook"].append(intake["per_s"])
                for kind, result in (("bare", bare), ("webhook", intake)):
                    lopsided[role][kind] += max(result["connections_by_worker"], default=0) > fair
                print(
                    f"  {name} {role:<9} bare {bare['per_s']:6.0f}/s {bare['cpu_ms']['machine']:.3f} ms"
                    f" {bare['connections_by_worker']}"
                    f"   webhooks {intake['per_s']:5.0f}/s {intake['cpu_ms']['machine']:.3f} ms"
                    f" {intake['connections_by_worker']}",
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.stop()
    check = json.loads(manage(env, "shell", "-c", CHECK, stdin=json.dumps(accepted)).strip().splitlines()[-1])

    def median(figures):
        return {
            role: {kind: statistics.median(v) for kind, v in kinds.items()} for role, kinds in figures.items()
        }

    return {
        "medians": median(cpu),
        "per_s": median(rate),
        "lopsided_rounds": lopsided,
        "accepted_not_stored": check["missing"],
    }


def main() -> None:
    parser = rounds_parser(__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="bench.gunicorn_unfrozen", help="a gunicorn settings module")
    parser.add_argument("--candidate", default="ankusa_site.gunicorn_conf", help="a gunicorn settings module")
    args = parse_rounds(parser)
    args.variants = [("baseline", args.baseline), ("candidate", args.candidate)]

    results = run_setups(args, measure)

    print(f"\nbaseline {args.baseline}, candidate {args.candidate}: medians of machine CPU ms per request")
    print(f"{'set-up':<10} {'kind':<8} {'baseline':>9} {'candidate':>10} {'ratio':>6}  (and of requests/s)")
    figures = {}
    for name, r in results.items():
        suffix = "" if name == "postgres" else f"_{name}"
        for kind in ("webhook", "bare"):
            base, cand = r["medians"]["baseline"][kind], r["medians"]["candidate"][kind]
            per_s = r["per_s"]["baseline"][kind], r["per_s"]["candidate"][kind]
            print(f"{name:<10} {kind:<8} {base:9.3f} {cand:10.3f} {cand / base:6.3f}  "
                  f"({per_s[0]:.0f} and {per_s[1]:.0f}/s: {per_s[1] / per_s[0]:.3f})")  # fmt: skip
            figures[f"cpu_ms_{kind}{suffix}"] = {"baseline": round(base, 3), "candidate": round(cand, 3)}
            figures[f"{kind}_cpu_candidate_vs_baseline{suffix}"] = round(cand / base, 3)
            base, cand = r["per_s"]["baseline"][kind], r["per_s"]["candidate"][kind]
            figures[f"{kind}_per_s{suffix}"] = {"baseline": round(base), "candidate": round(cand)}
            figures[f"{kind}_per_s_candidate_vs_baseline{suffix}"] = round(cand / base, 3)
        figures[f"lopsided_rounds{suffix}"] = r["lopsided_rounds"]
        print(f"{name:<10} rounds with a worker holding more than its share of the connections, of "
              f"{args.rounds}: {r['lopsided_rounds']}")  # fmt: skip
    figures["accepted_not_stored"] = sum(r["accepted_not_stored"] for r in results.values())
    figures["quick"] = args.quick
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
