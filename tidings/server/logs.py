"""Structured logs: one JSON object per line on stderr.

The server logs one line when it starts, one when it stops, and one per error; no
line per request unless ``access_log`` is on. Extra fields given as
``extra={...}`` become keys of the line (``event`` names what happened).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

__all__ = ["JsonFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else came from ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON line: ts, level, logger, msg, extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def configure_logging(level: str, access_log: bool) -> None:
    """Send every log line through :class:`JsonFormatter` to stderr.

    ``level`` applies to the server's own logger; everything else (uvicorn, the
    services' narration) logs warnings and errors only, unless ``level`` is debug.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    own = logging.getLevelName(level.upper())
    root.setLevel(logging.DEBUG if own == logging.DEBUG else max(logging.WARNING, own))
    logging.getLogger("tidings.server").setLevel(own)
    access = logging.getLogger("uvicorn.access")
    access.setLevel(logging.INFO if access_log else logging.WARNING)
