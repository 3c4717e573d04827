"""A site on a PostgreSQL cluster of the test's own, for tests that stop, restart or cut it under a
real gunicorn: the cluster's migrated database seeded (``acme/orders`` as in
``tests/commands/conftest.py``, a log connector, a tenant token), and a TCP proxy in front of the
cluster that cuts a connection right after the server answered a chosen write (``CuttingProxy``).
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from django.conf import settings

from tests.servers import free_port

SEED = """
import django
django.setup()
from commands.models import Connector, Source
from limits.models import ApiToken, Tenant
from tests.commands.conftest import HOOK_SECRET

tenant = Tenant.objects.create(slug="acme", name="Acme")
source = Source.objects.create(
    tenant=tenant, slug="orders", verifier="github", verifier_secrets=[HOOK_SECRET], dedupe_key="github"
)
source.connectors.set([Connector.objects.create(tenant=tenant, name="log", kind="log")])
print(ApiToken.issue(name="client", tenant=tenant)[1])
"""


@dataclass(frozen=True)
class Site:
    database_url: str
    token: str  # acme's tenant token


def manage_env(service_env: dict, database_url: str) -> dict:
    return {**service_env, "DATABASE_URL": database_url}


def set_up(service_env: dict, database_url: str) -> Site:
    """Seed the migrated database at ``database_url``."""
    env = manage_env(service_env, database_url)
    seeded = subprocess.run(
        [sys.executable, "-c", SEED], cwd=settings.BASE_DIR, env=env, check=True, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    return Site(database_url, seeded.stdout.strip().splitlines()[-1])


# The server's ReadyForQuery (then its status: idle, in a transaction or a failed one): the last
# message of its answer to a statement, sent once the statement is done (and committed, for one
# that commits by itself).
READY_FOR_QUERY = re.compile(rb"Z\x00\x00\x00\x05[ITE]")


class CuttingProxy:
    """A TCP proxy to PostgreSQL that forwards everything until ``cut_after(marker, then)``: the
    next client message holding ``marker`` arms it, and the first client bytes from then on that
    hold ``then`` (the marked message itself when ``then`` is None) are forwarded; the server's
    whole answer to them is read and dropped, and both connections are closed. The server has
    done the write; the client sees its connection break while it waits for the answer."""

    def __init__(self, port: int):
        self.target = ("127.0.0.1", port)
        self.port = free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.cuts = 0  # connections cut so far
        self._lock = threading.Lock()
        self._marker: bytes | None = None
        self._then: bytes | None = None
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after(self, marker: bytes, then: bytes | None = None) -> None:
        with self._lock:
            self._marker, self._then = marker, then

    def close(self) -> None:
        self._stopped = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            cut = threading.Event()
            threading.Thread(target=self._upstream, args=(client, server, cut), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, cut), daemon=True).start()

    def _upstream(self, client, server, cut: threading.Event) -> None:
        armed = False
        try:
            while data := client.recv(65536):
                with self._lock:
                    if self._marker is not None and not armed and self._marker in data:
                        armed = True
                    if armed and (self._then is None or self._then in data):
                        self._marker = self._then = None
                        cut.set()  # before forwarding: the answer to these bytes is dropped
                server.sendall(data)
        except OSError:
            pass
        _close(client, server)

    def _downstream(self, server, client, cut: threading.Event) -> None:
        dropped = b""
        try:
            while data := server.recv(65536):
                if cut.is_set():
                    dropped += data
                    if READY_FOR_QUERY.search(dropped):  # the server's whole answer: the write ended
                        with self._lock:
                            self.cuts += 1
                        break
                    continue
                client.sendall(data)
        except OSError:
            pass
        _close(client, server)


def _close(*socks) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
