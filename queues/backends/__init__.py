"""The queue backends, and which one serves a queue name: ``get_queue``.

Backend per queue name (settings, in precedence order): ``ANKUSA_QUEUE_BACKENDS`` (``name=redis``)
> ``ANKUSA_QUEUE_BACKEND`` > ``database``. Each backend implements ``queues.fifo.ReliableFIFO``
and is imported only when a queue asks for it (the Redis client is not loaded for a database
queue).
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from queues.fifo import ReliableFIFO


def backend_for(name: str) -> str:
    """The backend the settings choose for queue ``name``."""
    return settings.ANKUSA_QUEUE_BACKENDS.get(name, settings.ANKUSA_QUEUE_BACKEND)


def get_queue(name: str, backend: str | None = None) -> ReliableFIFO:
    """The queue called ``name`` on the backend the settings choose for it (or ``backend``)."""
    backend = backend or backend_for(name)
    options = {
        "requeue_limit": settings.ANKUSA_QUEUE_REQUEUE_LIMIT,
        "visibility_timeout": timedelta(seconds=settings.ANKUSA_QUEUE_VISIBILITY_TIMEOUT_S),
    }
    if backend == "database":
        from queues.backends.database import DatabaseFIFO

        return DatabaseFIFO(name, **options)
    if backend == "redis":
        from queues.backends.redis import RedisFIFO

        return RedisFIFO(name, **options)
    raise ValueError(f"Unknown queue backend {backend!r}: use 'database' or 'redis'.")
