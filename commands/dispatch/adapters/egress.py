"""Where a connector may send: only public addresses, unless the installation opens a network.

An address is refused when it is not a public one: unspecified, loopback, cloud metadata
(``METADATA``), link-local, multicast, private (RFC 1918, ULA ``fc00::/7``, shared
``100.64.0.0/10``) or anything else Python's ``ipaddress`` does not call global (reserved,
documentation, benchmarking, IPv6 site-local). An IPv4 address carried in an IPv6 one
(``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is judged as that IPv4 address.
``ANKUSA_CONNECTOR_ALLOWED_NETWORKS`` (CIDRs) opens networks an installation needs (``make run``
opens loopback for its demo receiver); an address inside one is allowed, whatever its kind.

A connector's host is checked twice:

* when it is saved (:func:`host_problem`, from ``Connector.clean``): a literal address, a name
  that always means one (``localhost`` and ``*.localhost``, RFC 6761; the metadata names), and the
  addresses the name resolves to then (a name that does not resolve yet passes: the send decides);
* at every new connection (:class:`CheckedHTTPConnection`): the name is resolved **once**, every
  address it resolves to is checked, and the socket connects to one of those checked addresses,
  while the request's ``Host``, the TLS SNI and the certificate check stay the name's. No
  DNS-rebinding window: nothing is resolved again between the check and the connect.

A refusal raises :class:`DestinationRefused`, which the HTTP adapter answers as ``after-fix``
with the reason (a person fixes the URL, or opens the network).

What this does not guarantee: that a public receiver does not itself forward what it receives
inward (redirects are not followed, but a proxy on the far side is out of sight); a connection
kept alive keeps the address it was checked at until it closes.
"""

from __future__ import annotations

import socket
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from django.conf import settings
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util import connection

Address = IPv4Address | IPv6Address

# The instance metadata services of the clouds: AWS, GCP, Azure, Oracle (169.254.169.254), AWS over
# IPv6 (fd00:ec2::254), AWS ECS task metadata (169.254.170.2), Alibaba (100.100.100.200). Named
# apart from the ranges they sit in because they are what an attacker aims at: credentials.
METADATA = frozenset(
    ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "169.254.170.2", "100.100.100.200")
)
# Names that always mean an address of this host or its cloud, whatever a resolver says.
LOOPBACK_NAMES = ("localhost",)
METADATA_NAMES = frozenset(
    {"metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"}
)
PRIVATE = tuple(
    ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
)
NAT64 = ip_network("64:ff9b::/96")
HINT = "ANKUSA_CONNECTOR_ALLOWED_NETWORKS opens a network an installation needs"


class DestinationRefused(Exception):  # noqa: N818 - it names what happened to the send
    """A connector's host is, or resolves to, an address it may not reach; the message says why."""


def allowed_networks() -> tuple[IPv4Network | IPv6Network, ...]:
    return settings.ANKUSA_CONNECTOR_ALLOWED_NETWORKS


def _embedded_ipv4(address: Address) -> IPv4Address | None:
    if not isinstance(address, IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_problem(address: Address) -> str | None:
    """What kind of address ``address`` is when a connector may not reach it ("a loopback
    address"); None when it may (public, or in an allowed network)."""
    if any(address in network for network in allowed_networks() if network.version == address.version):
        return None
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return address_problem(embedded)
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if any(address in network for network in PRIVATE if network.version == address.version):
        return "a private address"
    if address.is_reserved or not address.is_global or getattr(address, "is_site_local", False):
        return "a reserved address"  # also documentation, benchmarking and IPv6 site-local ranges
    return None


def _literal(host: str) -> Address | None:
    try:
        return ip_address(host.strip("[]"))
    except ValueError:
        return None


def _known_addresses(host: str) -> list[Address] | None:
    """The addresses a name always means (RFC 6761's localhost, the metadata names), else None."""
    name = host.lower().rstrip(".")
    if name in LOOPBACK_NAMES or name.endswith(".localhost"):
        return [ip_address("127.0.0.1"), ip_address("::1")]
    if name in METADATA_NAMES:
        return [ip_address("169.254.169.254")]
    return None


def resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to for a TCP connection, in the resolver's order, once each.
    Raises ``socket.gaierror`` when it does not resolve. Tests replace it to play a resolver."""
    found: list[Address] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = ip_address(sockaddr[0].split("%", 1)[0])  # an IPv6 zone ("fe80::1%eth0") is not an address
        if address not in found:
            found.append(address)
    return found


def _refusal(host: str, address: Address, problem: str, resolved: bool) -> str:
    said = f"it resolves to {address}, {problem}" if resolved else f"it is {problem}"
    shown = f"[{host}]" if ":" in host else host
    return f"the connector may not reach {shown}: {said} ({HINT})"


def check(host: str, port: int) -> list[Address]:
    """The addresses a connection to ``host`` may use: all of them, each checked. Raises
    :class:`DestinationRefused` if any is refused (one bad address in a round-robin answer
    refuses the name), ``socket.gaierror`` if the name does not resolve."""
    literal = _literal(host)
    known = _known_addresses(host)
    addresses = [literal] if literal is not None else known if known is not None else resolve(host, port)
    for address in addresses:
        problem = address_problem(address)
        if problem is not None:
            raise DestinationRefused(_refusal(host, address, problem, resolved=literal is None))
    return addresses


def host_problem(host: str, port: int) -> str | None:
    """Why a connector with this host may not be saved (None: it may). A name that does not resolve
    now is not refused: it may be set up later, and every send checks it again."""
    try:
        check(host, port)
    except DestinationRefused as exc:
        return str(exc)
    except (OSError, ValueError):  # no such name (yet), no resolver, or no name at all (IDNA refused it)
        return None
    return None


def known_problem(host: str) -> str | None:
    """Why a connector may not reach ``host``, told without a resolver: for a literal address or a
    name that always means one; None otherwise (a name is judged when it is resolved)."""
    if _literal(host) is None and _known_addresses(host) is None:
        return None
    try:
        check(host, 0)
    except DestinationRefused as exc:
        return str(exc)
    return None


class CheckedHTTPConnection(HTTPConnection):
    """urllib3's connection, resolving its host once and connecting only to a checked address."""

    def _new_conn(self) -> socket.socket:
        try:
            addresses = check(self._dns_host, self.port)
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        last: OSError | None = None
        for address in addresses:  # in the resolver's order, as urllib3's own connect tries them
            try:
                return connection.create_connection(
                    (str(address), self.port),
                    self.timeout,
                    source_address=self.source_address,
                    socket_options=self.socket_options,
                )
            except TimeoutError as exc:
                last = exc
                error = ConnectTimeoutError(
                    self, f"Connection to {self.host} timed out. (connect timeout={self.timeout})"
                )
            except OSError as exc:
                last = exc
                error = NewConnectionError(self, f"Failed to establish a new connection: {exc}")
        if last is None:
            raise NewConnectionError(self, f"{self.host} resolves to no address")
        raise error from last


class CheckedHTTPSConnection(CheckedHTTPConnection, HTTPSConnection):
    """The same, under TLS: the handshake's SNI and certificate check are for the host's name."""


class CheckedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = CheckedHTTPConnection


class CheckedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = CheckedHTTPSConnection


POOL_CLASSES = {"http": CheckedHTTPConnectionPool, "https": CheckedHTTPSConnectionPool}
