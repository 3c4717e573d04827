"""A worker process of the contention test: several threads drain one queue until it is empty.

``python -m tests.queues.drain BACKEND QUEUE BATCH...`` starts one thread per BATCH (each claims
that many items at a time), prints ``ready``, waits for a line on stdin so every process starts
at once, and prints one JSON line: the ids each thread claimed.
"""

from __future__ import annotations

import json
import os
import sys
import threading


def main(backend: str, name: str, batches: list[int]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection

    from queues.backends import get_queue

    claimed: list[list[int]] = []
    go = threading.Event()

    def drain(batch: int) -> None:
        queue = get_queue(name, backend=backend)
        mine: list[int] = []
        go.wait()
        # An empty claim means every item left is locked by another claimer, so it is theirs.
        while items := queue.claim(batch):
            mine.extend(item.id for item in items)
            queue.done(*items)
        claimed.append(mine)
        connection.close()

    threads = [threading.Thread(target=drain, args=(batch,)) for batch in batches]
    for thread in threads:
        thread.start()
    print("ready", flush=True)
    sys.stdin.readline()
    go.set()
    for thread in threads:
        thread.join()
    print(json.dumps(claimed), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(batch) for batch in sys.argv[3:]])
