"""Waking consumers when work is queued, instead of leaving it to their next poll.

The contract (``ReliableFIFO.wake`` / ``ReliableFIFO.wait_for_work``): a commit that puts items in
a queue's main sub-queue wakes the consumers waiting on that queue, within milliseconds; ``wake()``
asks for the same wake by hand (a change that makes work claimable without enqueueing it). A
consumer keeps polling as the safety net: a lost wake costs at most the poll interval.

* **PostgreSQL** (database backend): a trigger (migrations ``queues.0003`` and ``0004``) sends
  ``NOTIFY ankusa_queues, '<queue name>'`` from the transaction that puts a row in main, whatever
  wrote it (intake's one statement, the ORM, a requeue), so it is delivered on commit and never for
  a rollback — but only while a consumer sleeps: a ``NOTIFY`` makes commits take turns, database
  wide. A consumer about to wait says so (:class:`Gate`: shared advisory locks, which a committing
  trigger cannot take beside them), then looks at the queue, which waits for the commits that
  skipped their notification; it is awake again once woken or when it claims. ``wake()`` always
  notifies, in the caller's transaction. A process waits on ONE dedicated connection
  (:class:`Listener`, a thread reading its notifications), however many queues and threads wait on
  it, and holds the gate on one more.
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
from typing import Any

from django.db import connections

logger = logging.getLogger("ankusa.queues")

CHANNEL = "ankusa_queues"
# After a failed connection of the listener, it tries again after this pause, doubling up to the cap.
RECONNECT_FIRST_S = 0.1
RECONNECT_MAX_S = 5.0
# How long the listener's thread blocks on its socket before it looks at its stop flag.
READ_SLICE_S = 1.0


def connect(alias: str, name: str):
    """A psycopg connection of its own (autocommit) to the database ``alias``, named ``name``."""
    import psycopg

    params = connections[alias].get_connection_params()
    for private in ("cursor_factory", "context", "prepare_threshold"):  # Django's, not libpq's
        params.pop(private, None)
    return psycopg.connect(**params, autocommit=True, application_name=name)


class Gate:
    """This process's say that its consumers sleep, for the database ``alias``: while one does, the
    gate's connection (``ankusa-wake-gate``) holds every stripe of the wake lock shared
    (``queues_wake_sleep``), so commits that queue notify. A thread's consumer sleeps from
    :meth:`sleep` until :meth:`rise`; the stripes are let go, by a thread of the gate's, once no
    consumer of the process sleeps, so rising costs the caller no round trip."""

    def __init__(self, alias: str):
        self.alias = alias
        self.use = threading.Lock()  # the connection, and ``held`` with it
        self.lock = threading.Lock()  # ``sleepers``
        self.changed = threading.Condition(self.lock)
        self.sleepers: set[int] = set()
        self.conn: Any = None  # psycopg's, imported where used
        self.held = False
        self.riser: threading.Thread | None = None
        self.asked = False  # a rise asked of the riser

    def asleep(self) -> bool:
        """Whether the calling thread's consumer sleeps, behind a held gate."""
        return self.held and threading.get_ident() in self.sleepers

    def sleep(self, queue: str) -> bool:
        """The calling thread's consumer sleeps from now on (commits that queue notify), then looks
        at ``queue``: True when work is there already (it is awake again: the caller claims).
        False when it sleeps, and when the gate could not be held (a commit that queued holds its
        stripe past the lock timeout, the database does not answer): its poll covers that."""
        me = threading.get_ident()
        with self.lock:
            self.sleepers.add(me)
        found = None
        with self.use:
            if self.held:  # another thread's consumer holds it: this one's own look
                sql = "SELECT EXISTS (SELECT 1 FROM queues_queueitem WHERE queue = %s AND state = 'main')"
            else:
                sql = "SELECT queues_wake_sleep(%s)"  # NULL: not held (a stripe stayed taken)
            try:
                if self.conn is None:
                    self.conn = connect(self.alias, "ankusa-wake-gate")
                (found,) = self.conn.execute(sql, [queue]).fetchone()
                self.held = self.held or found is not None
            except Exception as exc:  # noqa: BLE001 - the poll is the safety net
                logger.debug("wake gate: cannot hold it (%s); polling", exc)
                self._lost()
        if not found:
            if found is None:
                self.rise()
            return False
        self.rise()
        return True

    def rise(self) -> None:
        """The calling thread's consumer is awake (it claims): the stripes go once none sleeps."""
        with self.lock:
            self.sleepers.discard(threading.get_ident())
            if self.sleepers or not self.held:
                return
            if self.riser is None:
                self.riser = threading.Thread(target=self._rise_when_asked, name="wake-gate", daemon=True)
                self.riser.start()
            self.asked = True
            self.changed.notify()

    def _rise_when_asked(self) -> None:
        while True:
            with self.lock:
                while not self.asked:
                    self.changed.wait()
                self.asked = False
            with self.use:
                with self.lock:
                    if self.sleepers or not self.held:
                        continue  # one went to sleep meanwhile
                try:
                    self.conn.execute("SELECT queues_wake_rise()")  # held: it is connected
                    self.held = False
                except Exception as exc:  # noqa: BLE001 - its session's locks go with it
                    logger.debug("wake gate: cannot let go (%s); closing", exc)
                    self._lost()

    def _lost(self) -> None:
        """Called holding ``use``: the connection failed; with its session went the stripes."""
        self.held = False
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001 - already broken
                pass
        self.conn = None

    def close(self) -> None:
        with self.use:
            self._lost()


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
        self.gate = Gate(alias)
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
        conn = connect(self.alias, "ankusa-wake")
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
        """Stop the thread and close the connections (within a read slice)."""
        self.stopping.set()
        self.thread.join(READ_SLICE_S * 5)
        self.gate.close()


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


def listening(alias: str) -> Listener | None:
    """This process's listener for ``alias`` if it has one already (none is started)."""
    import os

    return _listeners.get((os.getpid(), alias))


def close_listeners() -> None:
    """Stop this process's listeners (tests; a process that ends needs not)."""
    with _listeners_lock:
        found = list(_listeners.values())
        _listeners.clear()
    for one in found:
        one.close()


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
