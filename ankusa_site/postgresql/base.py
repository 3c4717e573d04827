"""Django's PostgreSQL backend, with a health check that costs no round trip when nothing is wrong.

With ``CONN_HEALTH_CHECKS`` (on: see ``ankusa_site.core.env``), ``is_usable`` first polls an idle
connection's socket without waiting: nothing to read, usable; anything there, Django's own
``SELECT 1`` decides. Not seen, any more than ``SELECT 1`` could without waiting on TCP timeouts:
a peer that vanished without a word (a cut cable). The first statement then fails, the request
answers its error (intake: 503, nothing stored), and Django drops the connection at the end of the
request.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        connection = self.connection
        if connection is None or connection.closed:
            return False
        if connection.info.transaction_status != pq.TransactionStatus.IDLE:
            return super().is_usable()
        # Django's own check sends SELECT 1: a round trip on every request (bench/README.md has
        # its cost). An idle session has nothing to read unless the server ended it: a server that
        # ends a session (a restart, pg_terminate_backend, idle_session_timeout) sends an error
        # and closes the socket, and either makes it readable. A notice can reach an idle session
        # too, so anything there goes to SELECT 1.
        poller = select.poll()
        try:
            poller.register(connection.fileno(), select.POLLIN | select.POLLPRI)
            events = poller.poll(0)
        except (OSError, ValueError):
            return False
        return not events or super().is_usable()
