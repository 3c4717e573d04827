"""The HTTP adapter's rules: POST the command's payload as JSON to the connector's URL.

The wire is ``commands.dispatch.adapters.http_async`` (aiohttp, on the process's send loop): keep-alive
connections per receiver, no automatic retries and no redirects (a retry is the retry decision's
business, never the client's), a connect and a read timeout and a hard deadline of both summed.
The adapter itself (``HttpAdapter``, registered as kind ``http``) lives with the wire, which
imports these rules: :meth:`HttpAdapter.send_async` is what the dispatcher awaits;
:meth:`HttpAdapter.send` is the synchronous door for one send from anywhere else.

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
character, a character past Latin-1, the encoding header values are sent in) is a configuration
problem: ``commands.dispatch.adapters.header_value_problem`` is the one rule, used when a connector is saved (the model's
validation, so the admin and the API refuse it), by :meth:`HttpAdapter.check` before a send (for rows
stored before the rule), and by the send itself before a byte goes out. Each says which header,
never its value: a client's own message quotes the value, and an outcome's detail is shown to the
tenant.

What this does not guarantee: a read timeout is ``again`` although the receiver may have acted;
that is safe only because a retry needs a connector that declared idempotency.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urlsplit

from django.conf import settings

from commands import signing
from commands.dispatch.adapters import header_value_problem
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
