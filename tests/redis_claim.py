"""A Redis database number of its own for each test run, so two runs on one machine never meet.

The fixtures flush the run's database around every test, so the mark that says a number is
taken cannot live in Redis: it is an exclusive ``flock`` on a file per server and number in a
lock folder (the system's temporary folder), held for the life of the process that claimed it
and let go by the kernel when that process ends, however it ends. Two runs starting at the same
instant cannot both win one lock. Database 0, the site's own default, is never a candidate.

A number is free when its lock can be taken and the database is empty, or its lock file says an
earlier run used it (that run may have been killed before its last flush). Not
guaranteed: runs on two machines sharing one Redis do not see each other's locks (only the
emptiness check stands between them), nor does anything else that writes to an empty database.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis

CANDIDATES = range(15, 0, -1)  # 15 first: the number every run used before; never 0
USED = b"used by an Ankusa test run\n"


@dataclass
class Claim:
    db: int
    lock_fd: int  # kept open for as long as the claim holds

    def release(self) -> None:
        os.close(self.lock_fd)


def lock_path(url: str, db: int, lock_dir: Path | None = None) -> Path:
    parts = urlsplit(url)
    where = f"{parts.hostname or 'localhost'}-{parts.port or 6379}".replace("/", "_")
    return Path(lock_dir or tempfile.gettempdir()) / f"ankusa-test-redis-{where}-{db}.lock"


def _lock(path: Path) -> int | None:
    """The open, exclusively locked file, or None when another process holds it (or another
    user's file cannot be opened for writing)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    try:
        os.fchmod(fd, 0o666)  # other users' runs must be able to lock it too (umask narrowed it)
    except OSError:
        pass
    return fd


def claim(url: str, *, lock_dir: Path | None = None, candidates: Iterable[int] = CANDIDATES) -> Claim:
    """Take the first free database number on the server ``url`` names (its own number ignored)."""
    candidates = list(candidates)
    for db in candidates:
        if db == 0:
            raise ValueError("database 0 is the site's own default: never a test database")
        fd = _lock(lock_path(url, db, lock_dir))
        if fd is None:
            continue
        # Read under the lock: the mark is written only by a run that claimed the number, so a
        # file some run created and left empty (it found someone else's data) marks nothing.
        if os.pread(fd, len(USED), 0) == USED or _is_empty(url, db):
            os.pwrite(fd, USED, 0)
            return Claim(db, fd)
        os.close(fd)  # someone else's data: not ours to flush
    raise RuntimeError(
        f"no free Redis test database on {urlsplit(url).netloc} among {list(candidates)}: "
        "set ANKUSA_TEST_REDIS_DB to one this run may flush"
    )


def hold(url: str, db: int, *, lock_dir: Path | None = None) -> Claim | None:
    """Mark a number given by hand as taken too, so no run claims it meanwhile; None when some
    process holds it already (the run that started this one, passing it on to a subprocess)."""
    fd = _lock(lock_path(url, db, lock_dir))
    if fd is None:
        return None
    os.pwrite(fd, USED, 0)
    return Claim(db, fd)


def with_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


def _is_empty(url: str, db: int) -> bool:
    client = redis.Redis.from_url(with_db(url, db), socket_timeout=2, socket_connect_timeout=1)
    try:
        return client.dbsize() == 0
    except redis.RedisError:
        # Redis does not answer: the tests that need it skip (or fail under CI) on their own;
        # the lock alone keeps two runs apart.
        return True
    finally:
        client.close()
