"""A local HTTP receiver for tests and benchmarks that counts what it receives.

``Sink`` runs in a thread of the calling process; ``python -m tests.commands.sink`` runs the same
server as its own process (the benchmark does, so the receiver does not share the dispatcher's
GIL) and prints ``port N`` once it listens. Either way ``GET /_stats`` answers
``{"received": n, "keys": {"<Idempotency-Key>": count}}``, and ``GET /_times`` when each key first
arrived (``{"<Idempotency-Key>": unix time}``, for the latency benchmark; ``?after=T``: since T).

How it answers is a function ``respond(request, nth) -> (status, headers)`` or ``(status, headers,
body)`` where ``nth`` is how many times this Idempotency-Key has been received, this request
included; the default answers 200.
It binds to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class ReceiverProcess:
    """A receiver started as its own process by ``argv`` (after the interpreter), which prints
    ``port N`` once it listens and stops when its standard input closes; ``stats()`` is its
    ``GET /_stats``. By default this module's sink."""

    def __init__(self, argv=("-m", "tests.commands.sink"), *, cwd=None, timeout: float = 10):
        self.timeout = timeout
        self.process = subprocess.Popen(
            [sys.executable, *argv], cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.port = int(self.process.stdout.readline().split()[1])
        self.url = f"http://127.0.0.1:{self.port}/receive"

    def stats(self, what: str = "stats", after: float = 0.0) -> dict:
        """``GET /_stats`` (or ``/_times`` with ``what="times"``: the keys first seen since ``after``)."""
        url = f"http://127.0.0.1:{self.port}/_{what}" + (f"?after={after}" if what == "times" else "")
        with urllib.request.urlopen(url, timeout=self.timeout) as response:
            return json.load(response)

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=self.timeout * 3)


class Gate:
    """A ``respond`` that holds every answer until ``open`` is set (at most 30 s), then says 200."""

    def __init__(self):
        self.open = threading.Event()

    def __call__(self, request, nth):
        self.open.wait(30)
        return 200, {}


@dataclass(frozen=True)
class Received:
    key: str
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: tuple = ()  # the client's (address, port): one per connection it opened

    @property
    def json(self):
        return json.loads(self.body)


Responder = Callable[[Received, int], tuple]


def ok(request: Received, nth: int) -> tuple[int, dict[str, str]]:
    return 200, {}


def script(*statuses: int) -> Responder:
    """Answer each key's n-th request with the n-th status; the last one repeats."""

    def respond(request: Received, nth: int) -> tuple[int, dict[str, str]]:
        return statuses[min(nth, len(statuses)) - 1], {}

    return respond


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def handle_error(self, request, client_address):
        # A client that died or timed out before our answer (the kill tests do this on purpose).
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Sink:
    def __init__(self, respond: Responder = ok, *, delay: float = 0.0, port: int = 0):
        self.respond = respond
        self.delay = delay
        self.received: list[Received] = []
        self.counts: Counter[str] = Counter()
        self.first_at: dict[str, float] = {}  # key -> when it first arrived (time.time())
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", port), self._handler())
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/receive"

    def __enter__(self) -> Sink:
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def keys_received_more_than_once(self) -> dict[str, int]:
        with self._lock:
            return {key: n for key, n in self.counts.items() if n > 1}

    def _record(self, request: Received) -> int:
        with self._lock:
            self.received.append(request)
            self.counts[request.key] += 1
            self.first_at.setdefault(request.key, time.time())
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return self.counts[request.key]

    def _answered(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _stats(self) -> bytes:
        with self._lock:
            return json.dumps({"received": len(self.received), "keys": dict(self.counts)}).encode()

    def _handler(self):
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: without this, Nagle's algorithm and the
            # client's delayed ACK add 40 ms to every keep-alive answer.
            disable_nagle_algorithm = True

            def log_message(self, *args):  # quiet: tests read the counts, not the log
                pass

            def _answer(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = urlsplit(self.path).path
                if path == "/_stats":
                    self._answer(200, {"Content-Type": "application/json"}, sink._stats())
                elif path == "/_times":
                    # ?after=T: the keys first seen since T only. The whole map, thousands of keys
                    # late in a benchmark, took milliseconds to write, and the sends arriving
                    # meanwhile waited for the lock to be noted.
                    after = float(parse_qs(urlsplit(self.path).query).get("after", ["0"])[0])
                    with sink._lock:
                        times = {key: at for key, at in sink.first_at.items() if at >= after}
                    self._answer(200, {"Content-Type": "application/json"}, json.dumps(times).encode())
                else:
                    self._answer(404, {})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = Received(
                    key=self.headers.get("Idempotency-Key", ""),
                    method=self.command,
                    path=self.path,
                    headers=dict(self.headers.items()),
                    body=body,
                    peer=self.client_address,
                )
                nth = sink._record(request)
                try:
                    if sink.delay:
                        time.sleep(sink.delay)
                    status, headers, *body = sink.respond(request, nth)
                finally:
                    sink._answered()
                default = b'{"ok": true}' if status < 300 else b'{"error": "sink"}'
                self._answer(status, headers, body[0] if body else default)

            do_PUT = do_PATCH = do_POST

            def do_HEAD(self):  # a health probe (commands.hold): answered as respond says, no body
                request = Received(
                    key="", method="HEAD", path=self.path, headers=dict(self.headers.items()), body=b""
                )
                nth = sink._record(request)
                try:
                    status, headers, *_ = sink.respond(request, nth)
                finally:
                    sink._answered()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

        return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A counting HTTP receiver on 127.0.0.1.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before answering")
    args = parser.parse_args(argv)
    with Sink(delay=args.delay, port=args.port) as sink:
        print(f"port {sink.port}", flush=True)
        try:
            sys.stdin.read()  # runs until its parent closes our stdin (or dies)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
