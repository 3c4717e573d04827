"""The latency benchmark's anchor (bench/latency.py): a Celery app with one empty task, on the
broker ``REDIS_URL`` names, configured as the site's (late acks, a prefetch of one, JSON). The
task only notes when it started, in the list ``HOPS`` of the same Redis.

    celery -A bench.celery_hop worker --pool solo
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

BROKER = os.environ["REDIS_URL"]
HOPS = "bench:celery_hop:started"

app = Celery("celery_hop", broker=BROKER)
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
_client = redis.Redis.from_url(BROKER)


@app.task(name="bench.hop")
def hop(number: int) -> None:
    _client.rpush(HOPS, f"{number} {time.time()}")
