"""Logging set-up: every record as one JSON object on one line.

Structured fields travel in ``extra=``; anything a record carries beyond the
standard ``LogRecord`` attributes becomes a field of its object. Newlines in
messages and tracebacks are escaped by JSON, so one record is always one line.

No code in keysvc logs headers, key IDs or secrets. aiohttp, though, logs a
request it cannot parse with the offending header line, which may be an
Authorization header; so every text that goes out is scrubbed of
Authorization values, Basic tokens and keysvc secrets first.
"""

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import IO

from keysvc.credentials import SECRET_PATTERN

REDACTED = "[redacted]"
_SCRUBS = (
    # The rest of the line: a malformed header may hold anything after its name.
    (re.compile(r"(authorization\s*:)[^\r\n]*", re.IGNORECASE), rf"\1 {REDACTED}"),
    (re.compile(r"\b(basic\s+)[A-Za-z0-9+/=_-]+", re.IGNORECASE), rf"\1{REDACTED}"),
    (re.compile(SECRET_PATTERN), REDACTED),
)

# The attributes every LogRecord has; anything else came in through ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def scrub(text: str) -> str:
    """``text`` without Authorization header values, Basic tokens or keysvc secrets."""
    for pattern, replacement in _SCRUBS:
        text = pattern.sub(replacement, text)
    return text


def _scrubbed(value: object) -> object:
    return scrub(value) if isinstance(value, str) else value


class JsonFormatter(logging.Formatter):
    """time, level, logger and message, then the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": scrub(record.getMessage()),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_"):
                entry[name] = _scrubbed(value)
        if record.exc_info:
            entry["exception"] = scrub(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = scrub(self.formatStack(record.stack_info))
        return json.dumps(entry, default=lambda value: scrub(str(value)))


def configure_logging(level: str, stream: IO[str] | None = None) -> logging.Handler:
    """Send every logger's records at ``level`` and above to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
