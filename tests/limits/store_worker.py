"""A process of the concurrency proofs: threads that hit one store at the same instant.

Run as ``python -m tests.limits.store_worker MODE JSON``. It builds its threads, prints ``ready``,
waits for a line on stdin (the parent's start signal, so every process starts together), runs,
and prints one JSON line with what it saw. Modes:

* ``hit``: each thread charges ``hits`` times one hook of a ``rate``/``burst`` limit;
* ``claim``: each thread claims the same event key once;
* ``hold``: take a claim, print ``held`` and wait to be killed (a holder that dies).
"""

from __future__ import annotations

import json
import sys
import threading
import time

from limits.gcra import Limit
from limits.store import Charge, Claim, LocalStore, Ok, RedisStore


def make_store(url: str):
    return LocalStore() if url == "local" else RedisStore(url, timeout_ms=5000)


def claim_for(args: dict, token: str) -> Claim:
    return Claim("acme", "src", args["key"], f"cmd-{token}", token, ttl_ms=600_000, pending_ttl_ms=30_000)


def main(mode: str, args: dict) -> None:
    store = make_store(args["url"])
    if mode == "hold":
        print(json.dumps({"held": type(store.hit([], claim_for(args, args["token"]))).__name__}), flush=True)
        time.sleep(600)
        return
    threads, results = args["threads"], []
    barrier = threading.Barrier(threads + 1)
    lock = threading.Lock()

    def work(index: int) -> None:
        barrier.wait()
        if mode == "hit":
            limit = Limit(args["rate"], args["burst"])
            charge = Charge("hooks", "acme", limit.increment_us, limit.capacity_us)
            answers = [store.hit([charge]) for _ in range(args["hits"])]
            seen = [isinstance(answer, Ok) for answer in answers]
        else:
            token = f"{args['proc']}-{index}"
            answer = store.hit([], claim_for(args, token))
            seen = [[type(answer).__name__, token, getattr(answer, "command_id", None)]]
        with lock:
            results.extend(seen)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    print("ready", flush=True)
    sys.stdin.readline()
    barrier.wait()
    for worker in workers:
        worker.join()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
