"""The HTTP adapter (kind ``http``, its rules in ``http``) and its wire: one send as an asyncio
coroutine, on aiohttp.

Why aiohttp rather than httpx's async client: per its documentation a ``ClientSession`` keeps one
``TCPConnector`` whose pool holds kept-alive connections per (host, port, TLS) key, it takes a
resolver of our own (``AbstractResolver``: the egress check sits exactly where a connection gets
its addresses), its timeouts split into connect, per-read and a total (the hard deadline of a
send), and its request path costs less CPU per request than httpx's, which matters with a
thousand sends in flight on one core.

One session per process (on ``commands.dispatch.event_loop``'s loop), made at first use:

* every new connection resolves its host once through :class:`CheckedResolver`, which runs
  ``egress.check`` and hands aiohttp only the checked addresses; the socket connects to one of
  them while SNI, the certificate check and ``Host`` stay the name's. No DNS cache: each
  connection is checked under the rules in force. A literal address never reaches a resolver; it
  is checked before every send by ``HttpAdapter.check``;
* no cookies (a receiver's cookie never rides on another command), no redirects, no proxies from
  the environment, no retries: a retry is the retry decision's business;
* the TLS context trusts the system's certificates (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` as set
  when a send is made).

Failures keep the class names the urllib3 sender wrote into ``last_error_class`` (staff filter on
them): ``NewConnectionError``, ``NameResolutionError``, ``ConnectTimeoutError``,
``ReadTimeoutError``, ``SSLError``; a send past its total deadline (connect + read timeout) is
``SendDeadline``. All of them are ``again``.

What this does not guarantee: a kept-alive connection keeps the address it was checked at until
it closes (15 s idle at most).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import json
import os
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from commands import signing
from commands.dispatch import event_loop
from commands.dispatch.adapters import EXCERPT_CHARS, Outcome, egress, header_value_problem
from commands.dispatch.adapters.http import (
    DRAIN_LIMIT_BYTES,
    header_problems,
    outlook_for,
    send_timeouts,
    sent_headers,
    url_carries_credentials,
    url_port_problem,
)
from commands.retry import Outlook

# Idle kept-alive connections close after this; a busy receiver's stay open.
KEEPALIVE_S = 15.0
# New connections being opened to one host at once (see PacedConnector).
CONNECTING_PER_HOST = 32


class CheckedResolver(AbstractResolver):
    """Resolves a host once per connection and returns only addresses ``egress.check`` allowed;
    raises ``egress.DestinationRefused`` (not an ``OSError``: aiohttp lets it through as is)."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        loop = asyncio.get_running_loop()
        # getaddrinfo blocks: on the loop's executor, as aiohttp's own threaded resolver does.
        addresses = await loop.run_in_executor(None, egress.check, host, port)
        return [
            {
                "hostname": host,
                "host": str(address),
                "port": port,
                "family": socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for address in addresses
        ]

    async def close(self) -> None:
        pass


class PacedConnector(aiohttp.TCPConnector):
    """aiohttp's connector, opening at most ``CONNECTING_PER_HOST`` connections to one host at a
    time. A thousand sends starting at once would otherwise start a thousand connects at once,
    and the connect timeout of the last would run while the loop still works through the first:
    it would time out without the receiver being slow. The timeout starts once a slot is had;
    the total deadline of the send still holds over the wait."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._connecting: dict[tuple[str | None, int | None], asyncio.Semaphore] = {}

    async def _wrap_create_connection(self, *args: Any, req: Any, **kwargs: Any) -> Any:
        key = (req.host, req.port)
        slot = self._connecting.get(key)
        if slot is None:
            slot = self._connecting[key] = asyncio.Semaphore(CONNECTING_PER_HOST)
        async with slot:
            return await super()._wrap_create_connection(*args, req=req, **kwargs)


_sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}


def session() -> aiohttp.ClientSession:
    """The running loop's session (made at first use)."""
    loop = asyncio.get_running_loop()
    found = _sessions.get(loop)
    if found is None or found.closed:
        connector = PacedConnector(
            limit=0,  # the dispatcher bounds the sends in flight, per connector and in all
            limit_per_host=0,
            use_dns_cache=False,
            resolver=CheckedResolver(),
            keepalive_timeout=KEEPALIVE_S,
        )
        found = _sessions[loop] = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
            raise_for_status=False,
        )
        atexit.register(_close_at_exit, loop, os.getpid())
    return found


def _close_at_exit(loop: asyncio.AbstractEventLoop, pid: int) -> None:
    """Close the session's connections as the process ends (its loop's thread still runs then)."""
    if pid == os.getpid() and loop.is_running():
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close_session(), loop).result(2)


async def close_session() -> None:
    """Close the running loop's session and its connections (tests: a clean slate of connections)."""
    found = _sessions.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.close()


@functools.lru_cache(maxsize=8)
def _tls(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile, capath=capath)


def tls_context() -> ssl.SSLContext:
    """The system's trust, or what ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` name now (one per pair)."""
    return _tls(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


def _failure(error_class: str, exc: BaseException) -> Outcome:
    return Outcome(
        ok=False,
        outlook=Outlook.AGAIN,
        detail=str(exc)[:EXCERPT_CHARS] or error_class,
        error_class=error_class,
    )


def _error_class(exc: BaseException) -> str:
    """The name a failed send is recorded under (the urllib3 sender's, for the same failure)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "ConnectTimeoutError"
    if isinstance(exc, aiohttp.SocketTimeoutError):
        return "ReadTimeoutError"
    if isinstance(exc, asyncio.TimeoutError):
        return "SendDeadline"
    if isinstance(exc, aiohttp.ClientSSLError | ssl.SSLError):
        return "SSLError"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "NameResolutionError"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "NewConnectionError"
    return type(exc).__name__


async def _excerpt(response: aiohttp.ClientResponse) -> str:
    """The answer's first ``EXCERPT_CHARS`` bytes; the rest drained to keep the connection (up to
    ``DRAIN_LIMIT_BYTES``), else the connection is closed."""
    data = bytearray()
    try:
        while len(data) < EXCERPT_CHARS:
            chunk = await response.content.read(EXCERPT_CHARS - len(data))
            if not chunk:
                break
            data += chunk
        length = response.content_length
        if response.content.at_eof():
            response.release()
        elif length is not None and length - len(data) <= DRAIN_LIMIT_BYTES:
            await response.read()  # the rest, then released for the next send
        else:
            response.close()
    except (TimeoutError, aiohttp.ClientError):
        response.close()  # the status came back; a body cut short keeps what arrived
    return data.decode("utf-8", "replace")


async def send(command: Any) -> Outcome:
    """Send ``command`` once: POST (or the connector's method) its payload as JSON."""
    connector = command.connector
    headers = sent_headers(connector)
    headers["Content-Type"] = "application/json"
    headers["Idempotency-Key"] = str(command.pk)
    if connector.secret_header:
        headers[connector.secret_header] = connector.secret
    body = json.dumps(command.payload, separators=(",", ":")).encode()
    headers.update(signing.send_headers(command, body))  # Standard Webhooks, when it signs
    # A header that cannot be sent is refused before a byte goes out, naming the header only (a
    # client's own message would quote the value, and the outcome's detail is shown to the tenant).
    problem = next(header_problems(headers), None)
    if problem is not None:
        return Outcome(ok=False, outlook=Outlook.AFTER_FIX, detail=problem, error_class="Configuration")
    connect, read = send_timeouts(connector)
    timeout = aiohttp.ClientTimeout(total=connect + read, sock_connect=connect, sock_read=read)
    try:
        async with session().request(
            connector.method,
            connector.url,
            data=body,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,
            ssl=tls_context() if connector.url.lower().startswith("https:") else True,
        ) as response:
            status = response.status
            retry_outlook = response.headers.get("Retry-Outlook")
            excerpt = await _excerpt(response)
    except egress.DestinationRefused as exc:
        return Outcome(ok=False, outlook=Outlook.AFTER_FIX, detail=str(exc), error_class="DestinationRefused")
    except (TimeoutError, aiohttp.ClientError) as exc:
        return _failure(_error_class(exc), exc)
    if 200 <= status <= 299:
        return Outcome(ok=True, status=status, excerpt=excerpt)
    return Outcome(
        ok=False,
        outlook=outlook_for(status, retry_outlook, connector.status_map),
        status=status,
        detail=f"HTTP {status}",
        error_class="HTTPStatus",
        excerpt=excerpt,
    )


async def head(connector: Any) -> tuple[int, str | None]:
    """A ``HEAD`` of the connector's URL through the same checked session (a held connector's
    health probe: nothing is sent): its status and ``Retry-Outlook``. Raises what the request
    raises, ``egress.DestinationRefused`` included (a literal address is checked here: no
    resolver sees it)."""
    problem = egress.known_problem(urlsplit(connector.url).hostname or "")
    if problem is not None:
        raise egress.DestinationRefused(problem)
    connect, read = send_timeouts(connector)
    async with session().head(
        connector.url,
        headers=sent_headers(connector),
        timeout=aiohttp.ClientTimeout(total=connect + read, sock_connect=connect, sock_read=read),
        allow_redirects=False,
        ssl=tls_context() if connector.url.lower().startswith("https:") else True,
    ) as response:
        return response.status, response.headers.get("Retry-Outlook")


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
        """One send from a thread that is not the send loop's: run on the loop, waited for."""
        return event_loop.run(self.send_async(command))

    async def send_async(self, command) -> Outcome:
        """One send, as a coroutine on the send loop (what the dispatcher awaits)."""
        return await send(command)


ADAPTER = HttpAdapter()
