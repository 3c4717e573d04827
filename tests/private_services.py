"""A redis-server and a PostgreSQL cluster of a test's (or a benchmark's) own, on free ports.

Fault tests kill and restart these, never the shared services on 6379 and 5432. Each server
lives in a temporary folder that ``stop()`` removes. PostgreSQL refuses to run as root, so when
the test runs as root the cluster is owned by and run as the ``postgres`` user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import psycopg
import redis

from tests.servers import free_port

MIGRATED = "ankusa"  # the database the ``migrated_postgres`` fixture's clusters hold, migrated


class PrivateRedis:
    """A redis-server of this test's own, on a free port, that the test may stop and start again."""

    def __init__(self, binary: str, workdir, password: str = ""):
        self.binary = binary
        self.workdir = workdir
        self.password = password
        self.port = free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=2)

    def start(self) -> None:
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", str(self.workdir)]  # fmt: skip
        if self.password:
            command += ["--requirepass", self.password]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"private redis-server on port {self.port} did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        """SIGKILL: what a crash does. ``start()`` brings it back, empty, on the same port."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None


def postgres_bindir() -> str | None:
    """Debian's PostgreSQL binaries (``initdb``, ``pg_ctl``), the newest installed; None if none."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


class PrivatePostgres:
    """A PostgreSQL cluster of this test's own (``initdb`` in a temporary folder, a free port).

    ``restart(mode="immediate")`` is the crash-like restart an operator's ``pg_ctl restart -m
    immediate`` is: every connection is cut and the server answers again on the same port.
    ``fsync`` is off (only a crash of the machine would lose data); commits stay synchronous, so
    an immediate restart loses no commit the server has answered, as on a real server.
    """

    def __init__(self, bindir: str, max_connections: int = 100, copy_of: PrivatePostgres | None = None):
        """``copy_of``: a stopped cluster whose files this one starts from (its databases, migrated
        once for many tests), instead of a new ``initdb``."""
        self.bindir = bindir
        self.port = free_port()
        self.max_connections = max_connections
        self.root = tempfile.mkdtemp(prefix="ankusa-pg-")
        self.data = os.path.join(self.root, "data")
        self.log = os.path.join(self.root, "server.log")
        # PostgreSQL will not run as root: the cluster belongs to the postgres user then.
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        if copy_of is None:
            self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        else:  # owner and modes kept: PostgreSQL refuses a data folder others can read
            subprocess.run(["cp", "-a", copy_of.data, self.data], check=True, timeout=120)

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            [os.path.join(self.bindir, tool), *args], user=self.user, check=check,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
        )  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   f"-c full_page_writes=off -c max_connections={self.max_connections}")  # fmt: skip
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-o", options, "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop", check=False)

    def restart(self, mode: str = "immediate") -> None:
        self.stop(mode)
        self.start()

    def kill(self) -> None:
        """SIGKILL the postmaster (its backends then end by themselves); ``start()`` recovers."""
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as pid_file:
                os.kill(int(pid_file.readline()), signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            return
        deadline = time.monotonic() + 30
        while os.path.exists(os.path.join(self.data, "postmaster.pid")) and time.monotonic() < deadline:
            if self._run("pg_ctl", "-D", self.data, "status", check=False).returncode != 0:
                break
            time.sleep(0.05)

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
