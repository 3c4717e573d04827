"""The log adapter: writes the command to the ``ankusa.connector`` log and always succeeds.

For demos and tests: it exercises the whole dispatch path without a receiver. It needs no
configuration, so it never reports a problem of its own. The line names the command, tenant,
connector and payload size; the payload itself is redacted like every body in our logs
(``ankusa_site.core.logs``), because a payload may carry what a tenant would not want in a log file.
"""

from __future__ import annotations

import json
import logging

from ankusa_site.core.logs import log_event
from commands.dispatch.adapters import Outcome

logger = logging.getLogger("ankusa.connector")


class LogAdapter:
    kind = "log"
    label = "Log (writes the command to the log)"

    def check(self, connector) -> list[str]:
        return []

    def send(self, command) -> Outcome:
        size = len(json.dumps(command.payload, separators=(",", ":")).encode())
        log_event(
            logger,
            "command_logged",
            command=command.pk,
            tenant=command.tenant_id,
            connector=command.connector.name,
            size_bytes=size,
        )
        return Outcome(ok=True, detail="logged")


ADAPTER = LogAdapter()
