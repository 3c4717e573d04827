"""The process's event loop for sends: one asyncio loop in a thread of its own, per process.

Every send this process makes runs on it: a dispatcher's sends in flight (``commands.senders``),
a Celery worker's (the same dispatcher, in the worker process), and a single send from anywhere
else (:func:`run`, the synchronous door: the admin's "send a test", the tests). A send in flight
is a task on this loop, not a thread and not a database connection.

Guaranteed: one loop per process, started at first use; a forked child (a Celery prefork worker)
starts its own, as the parent's thread did not survive the fork. Not guaranteed: that a coroutine
given to :func:`run` is cancelled when its timeout passes (it is; what it had sent stays sent).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

THREAD_NAME = "send-loop"

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_owner = 0  # the pid that started _loop: a forked child has the object but not the thread


def get() -> asyncio.AbstractEventLoop:
    """This process's send loop, started on first use."""
    global _loop, _owner
    with _lock:
        if _loop is None or _owner != os.getpid() or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=serve, name=THREAD_NAME, daemon=True).start()
            ready.wait()
            _loop, _owner = loop, os.getpid()
        return _loop


def on_loop() -> bool:
    """Whether the caller runs on the send loop itself (where :func:`run` would deadlock)."""
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False


def run(coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run ``coroutine`` on the send loop and wait for its result, from any other thread."""
    if on_loop():
        coroutine.close()
        raise RuntimeError("run() was called on the send loop; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coroutine, get()).result(timeout)
