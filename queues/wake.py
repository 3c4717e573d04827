"""Waking consumers when work is queued, instead of leaving it to their next poll.

The contract (``ReliableFIFO.wake`` / ``ReliableFIFO.wait_for_work``): a commit that puts items in
a queue's main sub-queue wakes the consumers waiting on that queue, within milliseconds; ``wake()``
asks for the same wake by hand (a change that makes work claimable without enqueueing it). A
consumer keeps polling as the safety net: a lost wake costs at most the poll interval.

* **PostgreSQL** (database backend): a trigger (migrations ``queues.0003`` and ``0004``) sends
  ``NOTIFY ankusa_queues, '<queue name>'`` from the transaction that puts a row in main, whatever
  wrote it (intake's one statement, the ORM, a requeue), so it is delivered on commit and never for
  a rollback — but only while a consumer sleeps: a ``NOTIFY`` makes commits take turns, database
  wide. A consumer about to wait says so (:func:`sleep`, on its own connection: shared advisory
  locks that a committing trigger cannot take beside them), then looks at the queue, which waits
  for the commits that skipped their notification; it lets go (:func:`rise`) once woken or when it
  claims. ``wake()`` always notifies, in the caller's transaction. A process waits on ONE
  dedicated connection (:class:`Listener`, a thread reading its notifications), however many
  queues and threads wait on it.
* **Redis**: an enqueue (and a requeue) pushes a token to the queue's wake list in the same round
  trip; a waiter pops it with ``BLPOP`` and a timeout. The list holds one token at most, so a
  busy producer costs no memory; each push wakes one waiter.
* **SQLite**: nothing wakes; ``wait_for_work`` sleeps out its timeout (polling, as before).

Not guaranteed: that every wake arrives (a listener reconnecting after a database restart misses
what was sent meanwhile, and reports a wake once it is back, so waiters look); that a wake means
work (another consumer may have claimed it first, or it is the wake a reconnected listener gives
its waiters); which of several Redis waiters wakes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict

from django.db import DatabaseError, connections

logger = logging.getLogger("ankusa.queues")

CHANNEL = "ankusa_queues"
# After a failed connection of the listener, it tries again after this pause, doubling up to the cap.
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0
# How long the listener's thread blocks on its socket before it looks at its stop flag.
READ_SLICE_S = 1.0


class Listener:
    """One LISTENing PostgreSQL connection for a process and database alias, read by a thread of
    its own; ``wait(queue, timeout)`` returns True once a notification for ``queue`` arrived since
    the last wait for it returned (or the listener (re)connected), False after ``timeout``."""

    def __init__(self, alias: str):
        self.alias = alias
        self.lock = threading.Lock()
        self.events: defaultdict[str, threading.Event] = defaultdict(threading.Event)
        self.connected = threading.Event()
        self.stopping = threading.Event()
        self.conn = None
        self.failures = 0
        self.connected_once = False  # a first connection missed nothing: nobody listened before
        self.thread = threading.Thread(target=self._run, name=f"wake-{alias}", daemon=True)
        self.thread.start()

    def wait(self, queue: str, timeout: float) -> bool:
        with self.lock:
            event = self.events[queue]
        woken = event.wait(max(timeout, 0.0))
        if woken:
            # Taken. (Cleared only when set: clearing after a timeout would drop a wake that came
            # just then. One that comes between the wait and this line stands for work committed
            # before it, which the caller's next look finds.)
            event.clear()
        return woken

    def _connect(self):
        import psycopg

        params = connections[self.alias].get_connection_params()
        for private in ("cursor_factory", "context", "prepare_threshold"):  # Django's, not libpq's
            params.pop(private, None)
        conn = psycopg.connect(**params, autocommit=True, application_name="ankusa-wake")
        conn.execute(f"LISTEN {CHANNEL}")
        return conn

    def _wake_all(self) -> None:
        with self.lock:
            for event in self.events.values():
                event.set()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.conn = conn = self._connect()
            except Exception as exc:  # the database is down: waiters poll meanwhile
                self.failures += 1
                if self.failures == 1:
                    logger.warning("wake listener: cannot connect (%s); consumers poll meanwhile", exc)
                pause = min(RECONNECT_FIRST_S * 2 ** (self.failures - 1), RECONNECT_MAX_S)
                self.stopping.wait(pause)
                continue
            self.failures = 0
            if self.connected_once:
                self._wake_all()  # whatever was sent while it was away: the waiters look
            self.connected_once = True
            self.connected.set()
            try:
                while not self.stopping.is_set():
                    for notify in conn.notifies(timeout=READ_SLICE_S):
                        with self.lock:
                            event = self.events[notify.payload]
                        event.set()
            except Exception as exc:
                if not self.stopping.is_set():
                    logger.warning("wake listener: connection lost (%s); reconnecting", exc)
            finally:
                self.connected.clear()
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - already broken
                    pass

    def close(self) -> None:
        """Stop the thread and close the connection (within a read slice)."""
        self.stopping.set()
        self.thread.join(READ_SLICE_S * 5)


_listeners: dict[tuple[int, str], Listener] = {}
_listeners_lock = threading.Lock()


def listener(alias: str) -> Listener:
    """This process's listener for the database ``alias`` (started at the first call; a forked
    child gets its own)."""
    import os

    key = (os.getpid(), alias)
    with _listeners_lock:
        found = _listeners.get(key)
        if found is None:
            found = _listeners[key] = Listener(alias)
        return found


def listening(alias: str) -> bool:
    """Whether this process has a listener for ``alias`` already."""
    import os

    return (os.getpid(), alias) in _listeners


def close_listeners() -> None:
    """Stop this process's listeners (tests; a process that ends needs not)."""
    with _listeners_lock:
        found = list(_listeners.values())
        _listeners.clear()
    for one in found:
        one.close()


# The connection a thread's consumer sleeps on, kept on Django's wrapper of it: a new connection
# (after a restart, or one Django closed) holds no lock, so it is not gated.
GATE_ATTRIBUTE = "ankusa_wake_gate"


def gated(connection) -> bool:
    """Whether this thread's ``connection`` (Django's) holds the wake gate: its consumer sleeps."""
    held = getattr(connection, GATE_ATTRIBUTE, None)
    return held is not None and held is connection.connection


def sleep(connection, queue: str) -> bool:
    """Say that the consumer on ``connection`` sleeps (commits that queue notify from now on), then
    look at ``queue``: True when work is there already (the gate is let go: the caller claims).
    False when it sleeps, or when it could not say so (a transaction that queued is still open,
    the database does not answer): its poll covers that."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT queues_wake_sleep(%s)", [queue])
            (found,) = cursor.fetchone()
    except DatabaseError as exc:
        logger.debug("wake gate: cannot sleep (%s); polling", exc)
        return False
    if found is None:
        return False
    setattr(connection, GATE_ATTRIBUTE, connection.connection)
    if found:
        rise(connection)
    return bool(found)


def rise(connection) -> None:
    """Let go of the gate the consumer on ``connection`` holds, if it does: it is about to claim."""
    if not gated(connection):
        return
    setattr(connection, GATE_ATTRIBUTE, None)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT queues_wake_rise()")
    except DatabaseError:
        connection.close()  # its session's locks go with it


def wait_until(wait_for_work, stop: threading.Event, seconds: float, *, slice_s: float = 0.25) -> bool:
    """Wait up to ``seconds`` for ``wait_for_work`` (a queue's) to report a wake, looking at ``stop``
    every ``slice_s``; True when woken, False on timeout or stop. A wait that fails (the queue's
    backend is down) sleeps the rest of its slice instead: the caller's poll goes on."""
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        step = min(left, slice_s)
        try:
            if wait_for_work(step):
                return True
        except Exception as exc:  # noqa: BLE001 - the poll is the safety net
            logger.debug("waiting for work failed (%s); polling", exc)
            stop.wait(step)
    return False
