"""The log adapter: writes the command to the ``ankusa.connector`` log and always succeeds.

For demos and tests: it exercises the whole dispatch path without a receiver. It needs no
configuration, so it never reports a problem of its own.
"""

from __future__ import annotations

import json
import logging

from commands.adapters import Outcome

logger = logging.getLogger("ankusa.connector")


class LogAdapter:
    kind = "log"
    label = "Log (writes the command to the log)"

    def check(self, connector) -> list[str]:
        return []

    def send(self, command) -> Outcome:
        payload = json.dumps(command.payload, separators=(",", ":"))
        logger.info("command %s via connector %s: %s", command.pk, command.connector.name, payload)
        return Outcome(ok=True, detail="logged")


ADAPTER = LogAdapter()
