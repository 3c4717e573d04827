"""One structured log line per significant event, as text or JSON (``ANKUSA_LOG_FORMAT``).

Call ``log_event(logger, "accepted", tenant=..., command=...)``: the event name and its fields
travel on the record, and the formatter writes them as ``key=value`` pairs (text) or one JSON
object per line (json), ready for a log shipper.

What it guarantees: a field whose name says it holds a secret or a body (``secret``, ``token``,
``password``, ``credential``, ``authorization``, ``signature``, ``body``, ``payload``) is written
as ``[redacted]`` whatever its value, so a careless call cannot leak one. What it does not: it
cannot see secrets inside free text passed as another field — never format secrets into messages.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from datetime import UTC, datetime
from typing import Any

REDACTED = "[redacted]"
_SENSITIVE = ("secret", "token", "password", "credential", "authorization", "signature", "body", "payload")

# No record of ours needs where its call was made (our formatters write no file or line), and
# finding it walks the stack on every call: about a quarter of a log line's cost, on paths that
# log once per request or per send. The logging documentation's own advice ("Optimization").
logging._srcfile = None


@functools.lru_cache(maxsize=1024)
def is_sensitive(name: str) -> bool:
    """Whether a field named ``name`` holds a secret or a body, by its name (the admin's filters
    refuse the same fields)."""
    return any(word in name.lower() for word in _SENSITIVE)


def redact(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: (REDACTED if is_sensitive(k) else v) for k, v in fields.items()}


def log_event(logger: logging.Logger, event: str, *, level: int = logging.INFO, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={"event": event, "fields": redact(fields)})


# A value written bare: not empty, and nothing that would end it or start another pair.
_BARE = re.compile(r'[^ ="\n]+')


def _text_value(value: Any) -> str:
    text = str(value)
    return text if _BARE.fullmatch(text) else json.dumps(text)


class TextFormatter(logging.Formatter):
    """``2026-11-30T04:20:00Z INFO ankusa.intake accepted tenant=demo command=12``."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        line = f"{stamp} {record.levelname} {record.name} {record.getMessage()}"
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``event`` or ``message``, fields."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        event = getattr(record, "event", None)
        if event:
            data["event"] = event
            data.update(getattr(record, "fields", {}))
        else:
            data["message"] = record.getMessage()
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)
