"""How long any request may take to send its body (``ANKUSA_BODY_TIMEOUT_S``), under gunicorn.

gunicorn's threaded worker reads a request's body with no timeout: a client that sends its headers
and then trickles the body (or never sends it) holds one of the worker's threads for as long as it
likes, and a handful of such clients hold every thread of a node. ``body_timeout`` — the first
middleware — gives the connection's socket a timeout before anything reads the body, and takes it
off again before gunicorn writes the answer. A read that times out raises
``TimeoutError`` (inside Django's ``UnreadablePostError``), which the places that read bodies turn
into a 408 (``timed_out``, ``stop_reading``): the intake's ``read_body`` and the API's error
handler; Django's CSRF check answers 403 for the admin's forms.
"""

from __future__ import annotations

import contextlib
import socket

from django.conf import settings


def body_timeout(get_response):
    def middleware(request):
        sock = request.META.get("gunicorn.socket")
        if sock is None:
            return get_response(request)
        sock.settimeout(settings.ANKUSA_BODY_TIMEOUT_S)
        try:
            return get_response(request)
        finally:  # the answer is written without it: a large one to a slow reader may take long
            sock.settimeout(None)

    return middleware


def timed_out(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a body read that ran out of time: a ``TimeoutError`` down its chain of
    causes (Django wraps the socket's in ``UnreadablePostError``, twice when read for ``.body``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, TimeoutError):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def stop_reading(request) -> str:
    """Read nothing more from ``request``'s connection (gunicorn would otherwise wait for the rest
    of the body before the connection's next request); the detail of the 408 to answer."""
    sock = request.META.get("gunicorn.socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RD)
    return f"The body did not arrive within {settings.ANKUSA_BODY_TIMEOUT_S:g} s."
