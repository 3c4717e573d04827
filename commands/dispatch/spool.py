"""The dispatch spool: outcomes of finished sends that a stopping process could not write to the
database, kept on this node's disk until a dispatcher here writes them back.

Where: ``ANKUSA_VAR_DIR/spool/dispatch/``, one JSON file per stopping process. A file is written
atomically (a temporary file in the same folder, flushed to disk, then renamed), so a reader sees a
whole file or none, and it is readable by its owner only (mode 0600: it names commands and quotes
their receivers' answers). A file is written back under an exclusive ``flock``, so two dispatchers
starting at once on one node write it once, and removed only after its outcomes are committed.

What this does NOT guarantee: a node that loses its disk loses its spool; a process killed with -9
writes none. The commands of a lost spool are recovered as ``WorkerLost`` (``outlook-unknown``) —
never sent a second time by the machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

SUFFIX = ".json"


def folder() -> Path:
    return Path(settings.VAR_DIR) / "spool" / "dispatch"


def write(records: list[dict]) -> Path:
    """Keep ``records`` (JSON values) in a new spool file; returns its path."""
    where = folder()
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    # mkstemp creates the file 0600 and its name unused (O_EXCL): nobody else reads it, no two
    # processes write one file. The leading dot keeps it out of pending() until it is whole.
    descriptor, temporary = tempfile.mkstemp(prefix=f".{os.getpid()}-", suffix=".tmp", dir=where)
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump(records, file)
            file.flush()
            os.fsync(file.fileno())
        final = where / (Path(temporary).name[1:].removesuffix(".tmp") + SUFFIX)
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    _sync_folder(where)  # the rename itself survives a power cut
    return final


def pending() -> list[Path]:
    """The spool files waiting to be written back, oldest first."""
    try:
        found = [
            path for path in folder().iterdir() if path.suffix == SUFFIX and not path.name.startswith(".")
        ]
    except FileNotFoundError:
        return []
    return sorted(found, key=_modified)


@contextlib.contextmanager
def replaying(path: Path) -> Iterator[list[dict] | None]:
    """Hold ``path`` for writing back: yields its records, or None when another process holds it
    or has written it back already. The file is removed when the block ends without an error."""
    try:
        file = open(path)  # held open for the lock, closed below
    except FileNotFoundError:
        yield None
        return
    with file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        if os.fstat(file.fileno()).st_nlink == 0:  # written back and removed while we opened it
            yield None
            return
        records = json.load(file)
        yield records
        os.unlink(path)  # still under the lock: a process waiting for it finds it removed
        _sync_folder(path.parent)


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _sync_folder(where: Path) -> None:
    descriptor = os.open(where, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
