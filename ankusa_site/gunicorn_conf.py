"""gunicorn settings shared by ``manage.py serve`` and the deploy units (``-c python:ankusa_site.gunicorn_conf``).

With ``PROMETHEUS_MULTIPROC_DIR`` set, a worker that exits leaves its metric files behind; this
tells prometheus-client it is gone so its live gauges (the fleet breaker state) stop being
reported. Its counters stay summed in, as they should: what it counted happened.

Each worker, once it has loaded the site, moves every object alive then (modules, the URL
resolver, models, settings: hundreds of thousands of them) out of the cyclic garbage collector's
sight (``gc.freeze``). They live as long as the worker does, yet each collection of the oldest
generation walked them all again: ``perf`` under the intake benchmark put the collector at about
6 % of the machine's busy CPU. Garbage made while serving is collected as before.

What gunicorn refuses itself, before the site sees the request (a malformed request line or
header, a request line or headers over its limits, a transfer coding it does not take), it answers
with an HTML page of its own; here those answers are the site's JSON error, ``{"error", "detail"}``,
with the same status. gunicorn's WSGI worker classes (sync, gthread, the async ones) write them
through ``gunicorn.util.write_error``, which this module replaces when gunicorn loads it (master and
workers alike); the status line's phrase is the status's own (gunicorn pairs 501 with "Bad Request").
"""

import gc
import http
import json
import os

from gunicorn import util

# gunicorn's statuses for what it refuses, and the site's error codes for them.
SERVER_ERRORS = {
    400: ("bad_request", "The request is malformed"),
    403: ("forbidden", "The request is refused"),
    414: ("uri_too_long", "The request line is longer than the server takes"),
    417: ("expectation_failed", "The Expect header asks for what the server does not do"),
    431: ("headers_too_large", "The request's headers are too many or too long"),
    500: ("server_error", "The server failed to handle the request"),
    501: ("not_implemented", "The server does not take this transfer coding"),
}


def write_json_error(sock, status_int, reason, mesg):
    """``gunicorn.util.write_error`` (same arguments), answering JSON instead of HTML."""
    code, sentence = SERVER_ERRORS.get(status_int, SERVER_ERRORS[400 if status_int < 500 else 500])
    detail = f"{sentence}: {mesg[:300]}" if mesg else f"{sentence}."
    body = json.dumps({"error": code, "detail": detail}).encode()
    try:
        reason = http.HTTPStatus(status_int).phrase
    except ValueError:
        pass
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


util.write_error = write_json_error


def post_worker_init(worker):
    gc.collect()  # what loading left as garbage goes now, not frozen with the rest
    gc.freeze()


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
