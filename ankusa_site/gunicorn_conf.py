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

Forwarded headers: only a peer in ``ANKUSA_TRUSTED_PROXIES`` (IPs or networks; empty by default, so
nobody) may say what the client's scheme was (``X-Forwarded-Proto``, which gunicorn and Django's
``SECURE_PROXY_SSL_HEADER`` read) or who the client was (``X-Forwarded-For``, ``X-Real-IP``,
``Forwarded``): from any other peer those headers are dropped before the site sees the request.
gunicorn's own default trusted loopback, where anyone on the machine is. No peer may set
``SCRIPT_NAME`` or ``PATH_INFO`` by header (the site is served at the root; a prefix sent by a
client broke every path). A peer on a unix socket is trusted, as gunicorn trusts it: only who may
open the socket's file reaches it.

The access log (``AccessLog``) never writes a secret sent in a URL: a query parameter whose name
says it is one (``token``, ``key``, ``secret``, ``password``, ``signature``, ``auth``…) or that has
no name keeps its name and shows ``***`` for its value, in the request line, the query and the
referrer; a request header named like a secret, if a format asks for one, is ``***`` too.
"""

import gc
import http
import ipaddress
import json
import os
import re

from gunicorn import util
from gunicorn.glogging import Logger

from ankusa_site.env import env_networks
from ankusa_site.logs import is_sensitive

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

TRUSTED_PROXIES = env_networks("ANKUSA_TRUSTED_PROXIES", [])
forwarded_allow_ips = ",".join(str(network) for network in TRUSTED_PROXIES)
forwarder_headers = ""  # neither SCRIPT_NAME nor PATH_INFO from any peer: the site is at the root
# What a proxy says about the client, which only a trusted one may say.
PROXY_HEADERS = frozenset({"FORWARDED", "X-REAL-IP"})


def trusted_peer(peer) -> bool:
    """Whether ``peer`` (gunicorn's peer address) is one of ``ANKUSA_TRUSTED_PROXIES``."""
    if not isinstance(peer, tuple):
        return True  # a unix socket: gunicorn trusts it too (the file's mode says who connects)
    try:
        address = ipaddress.ip_address(peer[0])
    except ValueError:
        return False
    return any(address in network for network in TRUSTED_PROXIES)


def pre_request(worker, req):
    if not trusted_peer(req.peer_addr):
        req.headers = [
            (name, value)
            for name, value in req.headers
            if not (name.startswith("X-FORWARDED-") or name in PROXY_HEADERS)
        ]


# Query parameter names that carry credentials beyond what ``is_sensitive`` knows: API keys,
# provider signatures (``sig``), OAuth codes and ``auth``.
_SECRET_QUERY_NAME = re.compile(r"key|auth|sig|code", re.IGNORECASE)
MASK = "***"


def masked_query(query: str) -> str:
    """``query`` with the value of every parameter named like a secret, and every bare value, as
    ``***``. The names stay, so the line still says what was sent."""
    if not query:
        return query
    parts = []
    for part in query.split("&"):
        name, equals, _ = part.partition("=")
        if not equals or not name:
            parts.append(MASK if part else part)  # a value with no name says nothing of what it is
        elif is_sensitive(name) or _SECRET_QUERY_NAME.search(name):
            parts.append(f"{name}={MASK}")
        else:
            parts.append(part)
    return "&".join(parts)


def masked_target(target: str) -> str:
    """A request target or URL with its query masked (``masked_query``)."""
    head, question, query = target.partition("?")
    if not question:
        return target
    query, hash_, fragment = query.partition("#")
    return f"{head}?{masked_query(query)}{hash_}{fragment}"


def _secret_header(name: str) -> bool:
    return is_sensitive(name) or "cookie" in name or bool(_SECRET_QUERY_NAME.search(name))


class AccessLog(Logger):
    """gunicorn's logger, whose access lines never hold a secret sent in the URL or a header."""

    def atoms(self, resp, req, environ, request_time):
        atoms = super().atoms(resp, req, environ, request_time)
        atoms["r"] = " ".join(
            (environ["REQUEST_METHOD"], masked_target(environ["RAW_URI"]), environ["SERVER_PROTOCOL"])
        )
        atoms["q"] = masked_query(atoms["q"] or "")
        atoms["f"] = masked_target(atoms["f"])
        for key in atoms:
            if key.startswith("{") and key.endswith("}i") and _secret_header(key[1:-2]):
                atoms[key] = MASK
        return atoms


logger_class = AccessLog


def post_worker_init(worker):
    gc.collect()  # what loading left as garbage goes now, not frozen with the rest
    gc.freeze()


def child_exit(server, worker):
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
