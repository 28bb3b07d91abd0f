"""The access record: for every request, one structured log line on
``keysvc.access`` and, when metrics are on, the request metrics.

It is written once the error envelope is made (``keysvc.middleware``), so it
has the status the client gets, 401, 404 and 500 included. Routes are reported
by their template (``/v1/organizations/{organizationId}/keys/{keyId}``), never
by the raw path, and ``unmatched`` when no route matched, so neither logs nor
metric labels carry identifiers from the path. The caller is reported by its key UUID and
organization only: the Authorization header, the key ID and the secret are
never read here.
"""

import logging

from aiohttp import web

from keysvc.logs import AccessLines
from keysvc.metrics import Metrics
from keysvc.state import AUTH_OUTCOME, CALLER, REQUEST_ID

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


def _fields(request: web.Request, route: str, status: int, seconds: float) -> dict[str, object]:
    fields: dict[str, object] = {
        "requestId": request.get(REQUEST_ID),
        "method": request.method,
        "route": route,
        "status": status,
        "latencyMs": round(seconds * 1000, 3),
        "remote": request.remote,
    }
    caller = request.get(CALLER)
    if caller is not None:
        fields["caller"] = {"id": caller.id, "organizationId": caller.organization_id}
    outcome = request.get(AUTH_OUTCOME)
    if outcome is not None:
        fields["auth"] = outcome
    return fields


class Access:
    """What is kept of each answered request: the access log line and, when metrics
    are on, the request metrics. ``keysvc.middleware`` calls ``record`` once per request."""

    def __init__(self, logger: logging.Logger, metrics: Metrics | None):
        self._logger = logger
        self._lines = AccessLines(logger, "request")
        self._metrics = metrics

    def record(self, request: web.Request, status: int, seconds: float) -> None:
        route = route_template(request)
        metrics = self._metrics
        if metrics is not None:
            method = request.method if request.method in _METHODS else "other"
            metrics.observe_request(route, method, status, seconds)
            outcome = request.get(AUTH_OUTCOME)
            if outcome is not None:
                metrics.observe_auth(outcome)
        if self._logger.isEnabledFor(logging.INFO):
            self._lines.emit(_fields(request, route, status, seconds))
