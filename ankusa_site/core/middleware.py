"""Request bodies: how long one may take to arrive (``ANKUSA_BODY_TIMEOUT_S``, under gunicorn),
which views take a chunked one, and which a reader refuses by its headers (``body_encoding_problem``).

gunicorn's threaded worker reads a request's body with no time limit: a client that sends its
headers and then trickles the body (a byte every few seconds) or never sends it holds one of the
worker's threads for as long as it likes, and a handful of such clients hold every thread of a
node. A socket timeout does not help against the trickle: it bounds each wait, not the whole body.

``body_timeout`` — the first middleware — gives each request that has a body a deadline, kept by
one watching thread per process (:class:`Deadlines`). A request still running at its deadline has
its connection's read side shut: whoever waits for the body reads its end at once, and the request
is marked late (``late(request)``). The places that read bodies answer a late one 408
``request_timeout`` (``late_detail()``): the intake's ``read_body`` and the API's error handler;
Django's CSRF check answers 403 for an admin form it could not read. A request whose body came in
time and that runs past its deadline only loses its connection's keep-alive.

``chunked_body`` answers 411 ``length_required`` to a body sent with ``Transfer-Encoding:
chunked`` (no ``Content-Length``) to any view but the two that read one themselves, only up to the
tenant's limit: a webhook and a command's submission. Django's request reads ``Content-Length``
bytes, none without one: the REST API parsed such a body as empty, and a cancel posted chunked
with ``dry_run`` was done for real. Reading it for every view instead would have read up to the
site's limit before any authentication.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import socket
import threading
import time

from django.conf import settings
from django.urls import reverse

from ankusa_site.core.answers import error

LATE = "ankusa.body_late"  # set in a request's META when its deadline passed
# The watching thread wakes at most this often: deadlines are kept to within it.
GRAIN_S = 0.05


class Deadlines:
    """Requests' deadlines in one process, and the thread that keeps them.

    Every deadline is the same time after its request began, so they fall due in the order they
    were set: a queue, not a heap. A request that ends in time only leaves its entry, which the
    thread drops when it comes due."""

    def __init__(self):
        self._turn = threading.Condition()
        self._due: collections.deque = collections.deque()  # (deadline, number), in order
        self._open: dict[int, tuple] = {}  # number -> (socket, META) of the requests still running
        self._numbers = itertools.count()
        self._pid = None  # the process whose thread keeps them (gunicorn forks its workers)

    def watch(self, sock, meta: dict, seconds: float) -> int:
        with self._turn:
            if self._pid != os.getpid():
                self._pid = os.getpid()
                self._due.clear()
                self._open.clear()
                threading.Thread(target=self._keep, name="body-deadlines", daemon=True).start()
            number = next(self._numbers)
            self._open[number] = (sock, meta)
            self._due.append((time.monotonic() + seconds, number))
            if len(self._due) == 1:
                self._turn.notify()
            return number

    def forget(self, number: int) -> None:
        with self._turn:
            self._open.pop(number, None)

    def _keep(self) -> None:
        with self._turn:
            while True:
                now = time.monotonic()
                while self._due and (self._due[0][0] <= now or self._due[0][1] not in self._open):
                    _, number = self._due.popleft()
                    running = self._open.pop(number, None)
                    if running is not None:
                        _shut(*running)
                if not self._due:
                    self._turn.wait()
                else:
                    self._turn.wait(max(self._due[0][0] - now, GRAIN_S))


def _shut(sock, meta: dict) -> None:
    meta[LATE] = True
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)  # a thread waiting in recv() wakes with the end of the stream


DEADLINES = Deadlines()


def body_timeout(get_response):
    def middleware(request):
        meta = request.META
        sock = meta.get("gunicorn.socket")
        has_body = meta.get("CONTENT_LENGTH", "") not in ("", "0") or "HTTP_TRANSFER_ENCODING" in meta
        if sock is None or not has_body:
            return get_response(request)
        number = DEADLINES.watch(sock, meta, settings.ANKUSA_BODY_TIMEOUT_S)
        try:
            return get_response(request)
        finally:
            DEADLINES.forget(number)

    return middleware


def late(request) -> bool:
    """Whether ``request``'s body did not arrive by its deadline (its connection reads no more)."""
    return bool(request.META.get(LATE))


def late_detail() -> str:
    return f"The body did not arrive within {settings.ANKUSA_BODY_TIMEOUT_S:g} s."


def is_chunked(meta: dict) -> bool:
    return "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()


# Charsets a JSON body may say it is in: UTF-8, and ASCII, which is UTF-8 too.
READABLE_CHARSETS = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})


def body_encoding_problem(meta: dict) -> str | None:
    """Why a body cannot be read as the UTF-8 text it must be, from its headers: compressed
    (``Content-Encoding`` other than ``identity``), or in another charset. None: it can. Each was
    read as UTF-8 as it came: a gzip body a 400 "not UTF-8", a plain one labelled gzip accepted,
    UTF-16 read as UTF-8. The places that read bodies answer it with a 415."""
    encoding = meta.get("HTTP_CONTENT_ENCODING", "").strip().lower()
    if encoding not in ("", "identity"):
        return "Send the body uncompressed: no Content-Encoding is accepted."
    for parameter in meta.get("CONTENT_TYPE", "").split(";")[1:]:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in READABLE_CHARSETS:
            return "Send the body as UTF-8 (charset=utf-8, or none)."
    return None


@functools.cache
def _reads_its_own_chunks() -> tuple[str, str]:
    """(POST path, path prefix) of the views that read a chunked body themselves."""
    return reverse("commands-command-list"), "/hooks/"


def chunked_body(get_response):
    def middleware(request):
        if not is_chunked(request.META):
            return get_response(request)
        submit, hooks = _reads_its_own_chunks()
        if request.path_info.startswith(hooks) or (request.method == "POST" and request.path_info == submit):
            return get_response(request)
        detail = (
            "Send the body with a Content-Length: only webhooks and command submissions take a chunked one."
        )
        return error("length_required", detail, 411)

    return middleware
