"""Django's SQLite backend, waiting for the write lock in short steps rather than SQLite's own.

Every transaction here starts ``BEGIN IMMEDIATE`` (``ankusa_site.core.env``), so writers queue for the
one write lock there. The threads of one process that write to one file take turns on a lock of
the process's own first (handed over at once when a transaction ends); the thread whose turn it
is tries ``BEGIN IMMEDIATE`` without the busy handler and, while another process holds the write
lock, again in short steps. Both waits end at the connection's ``timeout``, after which it fails as
SQLite's would ("database is locked"). Statements outside a transaction keep SQLite's handler and
the same timeout. A database file that does not exist yet is created owner-only before SQLite
opens it (``ankusa_site.core.varfiles``): it holds signing secrets and credentials, and SQLite gives
the write-ahead log and shared-memory files the database file's own mode.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import weakref
from pathlib import Path

from django.db.backends.sqlite3 import base
from django.db.utils import OperationalError

from ankusa_site.core.varfiles import create_private

# SQLite's busy handler sleeps 1, 2, 5, 10, 15, 20, 25 … 100 ms between tries, while the intake's
# write holds the lock for well under a millisecond: under load the waiting threads slept most of
# the time away and the machine stood partly idle (bench/README.md, "SQLite's write lock").
FIRST_WAIT_S = 50e-6
LONGEST_WAIT_S = 1e-3
DEFAULT_TIMEOUT_S = 5.0  # Python's sqlite3.connect default, when OPTIONS name none

_turns: dict[str, threading.Lock] = {}
_turns_made = threading.Lock()


def _forget_turns() -> None:
    """In a forked child: a turn held by a thread of the parent belongs to no thread here."""
    global _turns_made
    _turns.clear()
    _turns_made = threading.Lock()


os.register_at_fork(after_in_child=_forget_turns)


def _turn(name: str) -> threading.Lock:
    with _turns_made:
        return _turns.setdefault(name, threading.Lock())


def _busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


class DatabaseWrapper(base.DatabaseWrapper):
    _turn_held: weakref.finalize | None = None

    def get_new_connection(self, conn_params):
        name = conn_params["database"]
        # Django always opens with uri=True; a name that is a "file:" URI (the in-memory test
        # database) or ":memory:" is no file to create.
        if (
            isinstance(name, str | Path)
            and str(name) not in ("", ":memory:")
            and not str(name).startswith("file:")
        ):
            try:
                create_private(Path(name))
            except OSError:
                pass  # a folder that is missing or not ours: SQLite's own error says so next
        return super().get_new_connection(conn_params)

    def _start_transaction_under_autocommit(self):
        if self.transaction_mode != "IMMEDIATE":
            return super()._start_transaction_under_autocommit()
        timeout_s = float(self.settings_dict["OPTIONS"].get("timeout", DEFAULT_TIMEOUT_S))
        deadline = time.monotonic() + timeout_s
        turn = _turn(self.settings_dict["NAME"])
        if not turn.acquire(timeout=timeout_s):
            raise OperationalError("database is locked")
        try:
            self._begin_immediate(deadline, timeout_s)
        except BaseException:
            turn.release()
            raise
        # Released when the transaction ends, or if this connection is collected before it does (a
        # thread that died inside ``atomic``): SQLite then rolls the transaction back as the
        # connection goes, and the turn must go with it.
        self._turn_held = weakref.finalize(self, turn.release)

    def _begin_immediate(self, deadline: float, timeout_s: float) -> None:
        connection = self.connection
        started = time.monotonic()
        with self.wrap_database_errors:
            connection.execute("PRAGMA busy_timeout = 0")
            try:
                wait = FIRST_WAIT_S
                while True:
                    try:
                        connection.execute("BEGIN IMMEDIATE")
                        if self.queries_logged:  # as Django's backend, whose BEGIN goes by its cursor
                            self.queries_log.append(
                                {"sql": "BEGIN IMMEDIATE", "time": f"{time.monotonic() - started:.3f}"}
                            )
                        return
                    except sqlite3.OperationalError as exc:
                        if not _busy(exc) or time.monotonic() >= deadline:
                            raise
                    time.sleep(wait)
                    wait = min(wait * 2, LONGEST_WAIT_S)
            finally:
                connection.execute(f"PRAGMA busy_timeout = {round(timeout_s * 1000)}")

    def _end_turn(self) -> None:
        held, self._turn_held = self._turn_held, None
        if held is not None:
            held()  # releases the turn, once

    def _set_autocommit(self, autocommit):
        try:
            super()._set_autocommit(autocommit)
        finally:
            if autocommit:  # the transaction ended (committed or rolled back): the next writer's turn
                self._end_turn()

    def _close(self):
        try:
            super()._close()
        finally:
            self._end_turn()
