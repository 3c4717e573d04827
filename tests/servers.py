"""A real gunicorn serving the site, for tests that need what only a real server does: several
worker processes, raw sockets, a node that can be killed."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from django.conf import settings

BODY = b'{"order": "A-1", "action": "ship"}'
# Chunked bodies no server can read: a size that is not hex, a chunk cut short.
MALFORMED_CHUNKS = {"bad-size": b"ZZ\r\n{}\r\n0\r\n\r\n", "cut-off": b"5\r\n{}\r\n"}


def wait_for(condition, timeout: float = 30.0, what: str = "condition"):
    """``condition()``'s first true value, looked for every 20 ms; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Node:
    """One gunicorn serving the site on a free port, with this test's database and Redis."""

    def __init__(self, env: dict, log_path, *, workers: int = 2, threads: int = 8, args: tuple = ()):
        self.port = free_port()
        self.log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "ankusa_site.wsgi", "--bind", f"127.0.0.1:{self.port}",
             "--config", "python:ankusa_site.gunicorn_conf",
             "--workers", str(workers), "--threads", str(threads), "--graceful-timeout", "2", *args],
            cwd=settings.BASE_DIR, env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while self.request("GET", "/readyz")[0] != 200:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"gunicorn on {self.port} did not start: see {log_path}")
            time.sleep(0.1)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict | None = None, timeout=30
    ):
        """``(status, json or None, headers)``; status 0 when the connection failed."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            raw = response.read()
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            return response.status, data, dict(response.getheaders())
        except (OSError, http.client.HTTPException):
            return 0, None, {}
        finally:
            conn.close()

    def hook(self, delivery: str, body: bytes = BODY, **headers):
        """POST a GitHub-signed webhook to the ``acme/orders`` source of ``tests/commands``."""
        from tests.commands.conftest import github_headers

        signed = {"Content-Type": "application/json", **github_headers(body, delivery), **headers}
        return self.request("POST", "/hooks/acme/orders/", body, signed)

    def workers(self) -> list[int]:
        path = f"/proc/{self.process.pid}/task/{self.process.pid}/children"
        with open(path) as children:
            return [int(pid) for pid in children.read().split()]

    def kill(self) -> None:
        """SIGKILL to the master and its workers: no handler runs, nothing is cleaned up."""
        pids = self.workers()
        self.process.kill()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


class Trickle:
    """While open, sends one byte (a space) every ``every`` seconds down each of ``socks``: a client
    that keeps its body coming too slowly to ever finish it. Sockets the server closed are skipped."""

    def __init__(self, socks: list, every: float = 0.1):
        self.socks, self.every = socks, every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._send, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join()

    def _send(self):
        while not self.stopped.wait(self.every):
            for sock in self.socks:
                try:
                    sock.send(b" ")
                except OSError:
                    pass


@dataclass(frozen=True)
class RawAnswer:
    status_line: str
    headers: dict[str, str]  # names in lower case
    body: bytes

    @property
    def status(self) -> int:
        return int(self.status_line.split(" ", 2)[1])


def read_to_close(sock) -> RawAnswer:
    """The one answer on ``sock``, read until the server closes the connection."""
    answer = b""
    while data := sock.recv(65536):
        answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {
        name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)
    }
    return RawAnswer(status_line, headers, body)
