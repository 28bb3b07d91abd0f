"""The access record: for every request, one structured log line on
``keysvc.http.access`` and, when metrics are on, the request metrics.

Written once the error envelope is made (``keysvc.http.middleware``), so it has the
status the client gets. Routes are reported by their template, or ``unmatched``, and
the caller by key UUID and organization only: no identifier from the path, no
Authorization header, key ID or secret. ``KEYSVC_ACCESS_LOG`` says which answers get
a line: ``all``; ``errors`` (the default), all but a verify's success; ``off``, none.
The metrics count every request whatever it says.
"""

import logging
from json.encoder import encode_basestring_ascii
from typing import NamedTuple

from aiohttp import web

from keysvc.http.routes import VERIFY
from keysvc.http.state import AUTH_OUTCOME, CALLER
from keysvc.logs import AccessLines, scrub
from keysvc.metrics import Metrics
from keysvc.models import Key

UNMATCHED = "unmatched"
# Any other method is counted as "other", so clients cannot mint label values.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_template(request: web.Request) -> str:
    """The template of the matched route, or ``unmatched`` (a 404 or 405)."""
    match = request.match_info
    resource = match.route.resource
    if match.http_exception is not None or resource is None:
        return UNMATCHED
    return resource.canonical


def _text(value: str | None) -> str:
    return "null" if value is None else encode_basestring_ascii(scrub(value))


class AccessEntry(NamedTuple):
    """What the access line says of one answered request."""

    request_id: str | None
    method: str
    route: str
    status: int
    seconds: float
    remote: str | None
    caller: Key | None
    outcome: str | None

    def fields(self) -> dict[str, object]:
        """The line's fields, for a log record (``AccessLines.emit``)."""
        entry: dict[str, object] = {
            "requestId": self.request_id,
            "method": self.method,
            "route": self.route,
            "status": self.status,
            "latencyMs": round(self.seconds * 1000, 3),
            "remote": self.remote,
        }
        if self.caller is not None:
            entry["caller"] = {"id": self.caller.id, "organizationId": self.caller.organization_id}
        if self.outcome is not None:
            entry["auth"] = self.outcome
        return entry

    def fields_json(self) -> str:
        """The rest of the access line (``AccessLines.emit``): ``fields``, each
        top-level string scrubbed as JsonFormatter scrubs it, written as the
        formatter's JSON encoder writes them, the closing brace included. One
        f-string rather than a dict and the encoder: the access line is written on
        every request (``tests/unit/test_logs.py`` compares the two)."""
        text = (
            f', "requestId": {_text(self.request_id)}, "method": {_text(self.method)},'
            f' "route": {_text(self.route)}, "status": {int(self.status)},'
            f' "latencyMs": {round(self.seconds * 1000, 3)!r}, "remote": {_text(self.remote)}'
        )
        caller = self.caller
        if caller is not None:
            text += (
                f', "caller": {{"id": {encode_basestring_ascii(caller.id)},'
                f' "organizationId": {encode_basestring_ascii(caller.organization_id)}}}'
            )
        if self.outcome is not None:
            text += f', "auth": {_text(self.outcome)}'
        return text + "}"


class Access:
    """What is kept of each answered request: the access log line and, when metrics
    are on, the request metrics. ``keysvc.http.middleware`` calls ``record`` once per request."""

    def __init__(self, logger: logging.Logger, metrics: Metrics | None, mode: str = "all"):
        """``mode``: which answers get a line, one of ``keysvc.config.ACCESS_LOGS``."""
        self._logger = logger
        # Decided here, once: None writes no line at all.
        self._lines = AccessLines(logger, "request") if mode != "off" else None
        # The route whose successes get no line; None: every answer gets one.
        self._quiet = VERIFY.path if mode == "errors" else None
        # Counted into directly: one call a family rather than two, on every request.
        self._tallies = metrics.tallies if metrics is not None else None

    def record(self, request: web.Request, request_id: str, status: int, seconds: float) -> None:
        """Log and count the answer to ``request``, whose ID the middleware made."""
        route = route_template(request)
        outcome = request.get(AUTH_OUTCOME)
        tallies = self._tallies
        if tallies is not None:
            method = request.method
            tallies.request(route, method if method in _METHODS else "other", status, seconds)
            if outcome is not None:
                tallies.auth(outcome)
        lines = self._lines
        if lines is None or (status < 400 and route == self._quiet):
            return
        if self._logger.isEnabledFor(logging.INFO):
            lines.emit(
                AccessEntry(
                    request_id,
                    request.method,
                    route,
                    status,
                    seconds,
                    request.remote,
                    request.get(CALLER),
                    outcome,
                )
            )
