"""gunicorn settings shared by ``manage.py serve`` and the deploy units (``-c python:ankusa_site.gunicorn_conf``).

Guaranteed: what gunicorn refuses before the site sees it (a malformed request line or header,
one over its limits, a transfer coding it does not take) is answered with the site's JSON error,
``{"error", "detail"}``, of the same status; only a peer in ``ANKUSA_TRUSTED_PROXIES`` (nobody by
default) may say who the client was or its scheme (``X-Forwarded-*``, ``X-Real-IP``,
``Forwarded``), and no peer may set ``SCRIPT_NAME`` or ``PATH_INFO``; the access log never writes
a secret sent in a URL or a header (its value is ``***``, its name stays). Each worker takes a new
connection only while one of its threads is free, freezes what it loaded out of the garbage
collector's sight, and, once it exits, stops reporting its live gauges (its counters stay summed
in: what it counted happened).
"""

import http
import ipaddress
import json
import os
import re

from gunicorn import util
from gunicorn.glogging import Logger

from ankusa_site.core.env import env_networks
from ankusa_site.core.logs import is_sensitive
from ankusa_site.core.longlived import freeze_startup

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


# gunicorn's worker classes (sync, gthread, the async ones) write their refusals through
# util.write_error, replaced here when gunicorn loads this module (master and workers alike); the
# status line's phrase is the status's own (gunicorn pairs 501 with "Bad Request").
util.write_error = write_json_error

# Not gunicorn's own default, which trusted loopback, where anyone on the machine is.
TRUSTED_PROXIES = env_networks("ANKUSA_TRUSTED_PROXIES", [])
forwarded_allow_ips = ",".join(str(network) for network in TRUSTED_PROXIES)
# Neither SCRIPT_NAME nor PATH_INFO from any peer: the site is served at the root, and a prefix
# sent by a client broke every path.
forwarder_headers = ""
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

# gunicorn's threaded worker, except that it takes a new connection only while one of its threads
# is free: with gunicorn's own, one worker could take every connection of a burst while the others
# idled (ankusa_site/gunicorn_worker.py). A threaded worker at any thread count, as deployed.
worker_class = "ankusa_site.gunicorn_worker.ThreadWorker"


def post_worker_init(worker):
    freeze_startup()  # what the worker loaded, out of the cyclic collector's sight


def child_exit(server, worker):
    # An exited worker's metric files stay behind; this tells prometheus-client it is gone, so its
    # live gauges (the fleet breaker's state) stop being reported.
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
