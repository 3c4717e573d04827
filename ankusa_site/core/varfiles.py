"""Owner-only files for the node's local state (``ANKUSA_VAR_DIR``: the SQLite database and its
write-ahead log, the generated secret key, the demo's token and password, the metrics folder).

They hold signing secrets, connectors' credentials and session keys, so nobody but the account the
site runs as may read them: the folder is ``0700`` (made so, or narrowed at boot when the site owns
it) and each file is created ``0600`` in the same call that creates it — never created with the
process's umask and narrowed afterwards, which would leave a moment in which it is readable.
SQLite creates the ``-wal`` and ``-shm`` files of a database with the database file's own mode.

What it does not do: narrow a file that already exists (an operator's choice stays), or a folder
the site does not own.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """``path`` as a folder only its owner can enter (parents made as the umask says)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=FOLDER_MODE)
    except FileExistsError:
        info = path.stat()
        if info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) & 0o077:
            path.chmod(stat.S_IMODE(info.st_mode) & ~0o077)
    return path


def create_private(path: Path) -> bool:
    """Create ``path`` empty and owner-only if it does not exist; whether it was created."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    except FileExistsError:
        return False
    return True


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, which is created owner-only if it does not exist."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
