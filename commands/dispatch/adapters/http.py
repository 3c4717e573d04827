"""The HTTP adapter: POST the command's payload as JSON to the connector's URL.

One urllib3 pool per process, shared by every dispatch thread (keep-alive connections to each
receiver, at most ``ANKUSA_DISPATCH_CONCURRENCY`` per host), no automatic retries and no redirects:
a retry is the retry decision's business, never the client's.

Each request carries ``Idempotency-Key: <command id>`` so a receiver can dedupe our retries, and
the connector's credential in the header it names (``secret_header``, e.g. ``Authorization``), and
the Standard Webhooks signature when the connector signs (``commands.signing``).
The connector's own headers go too, but never a framing or hop-by-hop one, one a send sets itself
or the credential's (:func:`sent_headers`; refused when saved, left out for rows saved before).
Every new connection goes only to an address ``commands.dispatch.adapters.egress`` allows, checked where it
connects; a refused one is ``after-fix``.

The outlook of a failure, in precedence order:

1. the receiver's own ``Retry-Outlook: again | after-fix | never`` response header — it knows best;
2. the connector's ``status_map`` (``{"409": "never"}``), set by staff for a receiver with quirks;
3. the defaults: network error, 408, 425, 429, 5xx → ``again``; 401, 403, 407 → ``after-fix``;
   400, 404, 405, 410, 413, 415, 422 → ``never``; anything else (3xx, other 4xx) → none (unknown).

A header value that cannot be sent (a CR or LF that would start another header, another control
character, a character past Latin-1, the encoding http.client sends values in) is a configuration
problem: ``commands.dispatch.adapters.header_value_problem`` is the one rule, used when a connector is saved (the model's
validation, so the admin and the API refuse it), by :meth:`HttpAdapter.check` before a send (for rows
stored before the rule), and by :meth:`HttpAdapter.send` if http.client refuses a header all the
same. Each says which header, never its value: http.client's own message quotes the value
("Invalid header value b'Bearer …'"), and an outcome's detail is shown to the tenant.

What this does not guarantee: a read timeout is ``again`` although the receiver may have acted;
that is safe only because a retry needs a connector that declared idempotency.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import urllib3
from django.conf import settings

from commands import signing
from commands.dispatch.adapters import EXCERPT_CHARS, Outcome, egress, header_value_problem
from commands.retry import Outlook

AGAIN_STATUSES = frozenset({408, 425, 429})
AFTER_FIX_STATUSES = frozenset({401, 403, 407})
NEVER_STATUSES = frozenset({400, 404, 405, 410, 413, 415, 422})
# How much of a body we drain to keep the connection for reuse; past this, closing is cheaper.
DRAIN_LIMIT_BYTES = 64 * 1024

# An HTTP header name is a token (RFC 9110 §5.6.2).
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Not quoted either: a name that is no token may hold a CR or LF.
BAD_HEADER_NAME = "a header name is not a valid HTTP header name"
# Headers a connector's own headers may not name (any case). Framing and hop-by-hop headers
# (RFC 9110 §7.6.1, RFC 9112 §6): a Content-Length or Transfer-Encoding of its own sent before our
# body desynchronises requests and answers on a kept-alive connection, a Host of its own sends the
# request to another virtual host than the URL names. And the ones a send sets itself.
FRAMING_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"}
)
DISPATCH_HEADERS = frozenset({"content-type", "idempotency-key"}) | signing.RESERVED_HEADERS


def reserved_header_problem(name: str) -> str | None:
    """Why a connector's headers may not set ``name`` (None: they may)."""
    lowered = name.lower()
    if lowered in FRAMING_HEADERS or lowered.startswith("proxy-"):
        return "is a framing or hop-by-hop header, which the connection sets itself"
    if lowered in DISPATCH_HEADERS:
        return "is set by every send itself"
    return None


def sent_headers(connector) -> dict[str, str]:
    """The connector's own headers as a send carries them: without the reserved ones and the one
    the credential goes in (rows saved before those rules), whatever their case."""
    secret_header = (connector.secret_header or "").lower()
    return {
        str(name): str(value)
        for name, value in (connector.headers or {}).items()
        if reserved_header_problem(str(name)) is None and str(name).lower() != secret_header
    }


def header_problems(headers: dict) -> Iterator[str]:
    """Why each header of ``headers`` that cannot be sent cannot, in words naming only the header."""
    for name, value in headers.items():
        if not HEADER_NAME.match(str(name)):
            yield BAD_HEADER_NAME
        elif problem := header_value_problem(str(value)):
            yield f"the value of the {name} header {problem}"


def url_carries_credentials(url: str) -> bool:
    """Whether ``url`` has a userinfo part (``user:password@host``, or an empty one); a URL that
    does not parse has none of its own (the URL validator refuses it)."""
    try:
        return "@" in urlsplit(url or "").netloc
    except ValueError:
        return False


def url_port_problem(url: str) -> str | None:
    """What is wrong with ``url``'s port, if it names one no connection can reach (the URL validator
    takes any five digits: 99999 was saved, then failed every send as a parse error, retried)."""
    try:
        port = urlsplit(url or "").port
    except ValueError:  # past 65535
        port = 0
    return "the URL's port is not a port (1 to 65535)" if port == 0 else None


def send_timeouts(connector=None) -> tuple[float, float]:
    """(connect, read) timeouts of one send: ``connector``'s own, or the site's defaults."""
    return (
        getattr(connector, "connect_timeout_s", None) or settings.ANKUSA_HTTP_CONNECT_TIMEOUT_S,
        getattr(connector, "read_timeout_s", None) or settings.ANKUSA_HTTP_READ_TIMEOUT_S,
    )


def longest_send_s(connector=None) -> float:
    """The longest one send may take (connect + read timeout): what the queue's visibility timeout
    must outlast, and what a stopping dispatcher is given to finish."""
    return sum(send_timeouts(connector))


_pool: urllib3.PoolManager | None = None
_pool_lock = threading.Lock()


def pool() -> urllib3.PoolManager:
    """This process's connection pool (created on first use, after settings are final)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = urllib3.PoolManager(
                num_pools=64, maxsize=settings.ANKUSA_DISPATCH_CONCURRENCY, retries=False
            )
            # Each new connection resolves its host once, checks every address and connects to a
            # checked one (commands.dispatch.adapters.egress).
            _pool.pool_classes_by_scheme = egress.POOL_CLASSES
        return _pool


# url -> (the host's connection pool in pool(), the request target): PoolManager.request parses
# the URL and looks its pool up on every call, about 30 us of a send's CPU on a path every command
# takes (measured against the benchmark's sink). Bounded: cleared past MAX_TARGETS urls.
_targets: dict[str, tuple[urllib3.HTTPConnectionPool, str]] = {}
MAX_TARGETS = 1024


def _target(url: str) -> tuple[urllib3.HTTPConnectionPool, str]:
    found = _targets.get(url)
    if found is None or found[0].pool is None:  # new, or closed by PoolManager.clear()
        if len(_targets) >= MAX_TARGETS:
            _targets.clear()
        found = _targets[url] = (pool().connection_from_url(url), urllib3.util.parse_url(url).request_uri)
    return found


def _post(method: str, url: str, **options) -> urllib3.BaseHTTPResponse:
    """``pool().request(method, url, redirect=False, ...)`` through the url's own connection pool."""
    host_pool, target = _target(url)
    try:
        return host_pool.urlopen(method, target, redirect=False, assert_same_host=False, **options)
    except urllib3.exceptions.ClosedPoolError:
        # The PoolManager dropped (and closed) this host's pool since we looked: nothing was sent.
        _targets.pop(url, None)
        return pool().request(method, url, redirect=False, **options)


def default_outlook(status: int | None) -> Outlook | None:
    """DESIGN.md's table; ``None`` status is a network error."""
    if status is None or status in AGAIN_STATUSES or 500 <= status <= 599:
        return Outlook.AGAIN
    if status in AFTER_FIX_STATUSES:
        return Outlook.AFTER_FIX
    if status in NEVER_STATUSES:
        return Outlook.NEVER
    return None


def outlook_for(status: int, header: str | None, status_map: dict) -> Outlook | None:
    said = (header or "").strip().lower()
    if said in Outlook.values:
        return Outlook(said)
    mapped = (status_map or {}).get(str(status))
    if mapped in Outlook.values:
        return Outlook(mapped)
    return default_outlook(status)


def _excerpt(response: urllib3.BaseHTTPResponse) -> str:
    data = response.read(EXCERPT_CHARS)
    remaining = response.length_remaining
    if remaining is not None and remaining <= DRAIN_LIMIT_BYTES:
        response.drain_conn()
        response.release_conn()
    else:
        response.close()
    return data.decode("utf-8", "replace")


class HttpAdapter:
    kind = "http"
    label = "HTTP (JSON POST)"

    def check(self, connector) -> list[str]:
        found = []
        parts = urlsplit(connector.url or "")
        if not connector.url:
            found.append("no URL")
        elif parts.scheme not in ("http", "https") or not parts.hostname:
            found.append("the URL must be an absolute http:// or https:// URL")
        elif url_carries_credentials(connector.url):
            found.append("the URL carries credentials; put them in the secret instead")
        elif problem := url_port_problem(connector.url):
            found.append(problem)
        elif problem := egress.known_problem(parts.hostname):  # names are judged as they resolve
            found.append(problem)
        if connector.secret_header and not connector.secret:
            found.append(f"missing credential for the {connector.secret_header} header")
        elif connector.secret_header and (problem := header_value_problem(connector.secret)):
            found.append(f"the secret for the {connector.secret_header} header {problem}")
        found += header_problems(connector.headers or {})
        return found

    def send(self, command) -> Outcome:
        connector = command.connector
        headers = sent_headers(connector)
        headers["Content-Type"] = "application/json"
        headers["Idempotency-Key"] = str(command.pk)
        if connector.secret_header:
            headers[connector.secret_header] = connector.secret
        body = json.dumps(command.payload, separators=(",", ":")).encode()
        headers.update(signing.send_headers(command, body))  # Standard Webhooks, when it signs
        connect, read = send_timeouts(connector)
        timeout = urllib3.Timeout(connect=connect, read=read)
        try:
            response = _post(
                connector.method,
                connector.url,
                body=body,
                headers=headers,
                timeout=timeout,
                preload_content=False,
            )
        except egress.DestinationRefused as exc:
            return Outcome(
                ok=False, outlook=Outlook.AFTER_FIX, detail=str(exc), error_class="DestinationRefused"
            )
        except urllib3.exceptions.HTTPError as exc:
            reason = getattr(exc, "reason", None) or exc
            return Outcome(
                ok=False,
                outlook=Outlook.AGAIN,
                detail=str(reason)[:EXCERPT_CHARS],
                error_class=type(reason).__name__,
            )
        except ValueError:
            # http.client refuses a header before a byte is sent ("Invalid header value b'…'", or a
            # UnicodeEncodeError quoting the character), and urllib3 drops that connection. Its
            # message quotes the value, so it is replaced; any other ValueError is a bug (unknown).
            problem = next(header_problems(headers), None)
            if problem is None:
                raise
            return Outcome(ok=False, outlook=Outlook.AFTER_FIX, detail=problem, error_class="Configuration")
        status = response.status
        excerpt = _excerpt(response)
        if 200 <= status <= 299:
            return Outcome(ok=True, status=status, excerpt=excerpt)
        return Outcome(
            ok=False,
            outlook=outlook_for(status, response.headers.get("Retry-Outlook"), connector.status_map),
            status=status,
            detail=f"HTTP {status}",
            error_class="HTTPStatus",
            excerpt=excerpt,
        )


ADAPTER = HttpAdapter()
