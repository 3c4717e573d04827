"""The counting receiver of ``bench/faults.py``: an HTTP server of its own on 127.0.0.1.

It answers every POST ``200 {"ok": true}`` after ``--delay-ms`` (as a real receiver takes some time
to act; 0 by default) and keeps, for each request, when it arrived
(``time.time()``, the clock the site writes its timestamps with), its ``Idempotency-Key`` (the
command's id) and the sender's port (which process sent it, while that process lives).
``GET /_log?from=N`` answers the records from the N-th on, as ``[[time, key, port], ...]``.

Started as ``python bench/fault_receiver.py [--delay-ms N]``, it prints ``port N`` once it listens and runs until
its standard input closes (its parent ended or let it go). A request is recorded once its body is
read, before the answer is written: a sender killed in between counts as received.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Receiver(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512

    def __init__(self, delay_s: float = 0.0):
        super().__init__(("127.0.0.1", 0), Handler)
        self.delay_s = delay_s
        self.records: list[tuple[float, str, int]] = []
        self.lock = threading.Lock()

    def handle_error(self, request, client_address):
        # A sender killed mid-request (the benchmark does that on purpose) is not an error here.
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

    def log_message(self, *args):
        pass

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        record = (time.time(), self.headers.get("Idempotency-Key", ""), self.client_address[1])
        with self.server.lock:
            self.server.records.append(record)
        if self.server.delay_s:
            time.sleep(self.server.delay_s)
        self._answer(b'{"ok": true}')

    def do_GET(self):
        parts = urlsplit(self.path)
        if parts.path != "/_log":
            self.send_error(404)
            return
        start = int(parse_qs(parts.query).get("from", ["0"])[0])
        with self.server.lock:
            records = self.server.records[start:]
        self._answer(json.dumps(records).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=0.0, help="how long each answer takes")
    server = Receiver(parser.parse_args().delay_ms / 1000)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    print(f"port {server.server_address[1]}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin, or dies
    server.shutdown()


if __name__ == "__main__":
    main()
