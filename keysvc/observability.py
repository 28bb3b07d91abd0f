"""The access middleware: for every request, one structured log line on
``keysvc.access`` and, when metrics are on, the request metrics. Being the
outermost layer, it also counts the requests in flight, which a shutdown waits
for (``keysvc.cli``).

It runs outside the error middleware, so it sees the status the client gets,
401, 404 and 500 included. Routes are reported by their template
(``/v1/organizations/{organizationId}/keys/{keyId}``), never by the raw path,
and ``unmatched`` when no route matched, so neither logs nor metric labels
carry identifiers from the path. The caller is reported by its key UUID and
organization only: the Authorization header, the key ID and the secret are
never read here.
"""

import asyncio
import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from keysvc.metrics import Metrics
from keysvc.state import AUTH_OUTCOME, CALLER, REQUEST_ID, InFlight

UNMATCHED = "unmatched"
# nginx's code for a client that went away before the answer was ready.
CLIENT_CLOSED = 499
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


def access_middleware(
    *, logger: logging.Logger, metrics: Metrics | None, in_flight: InFlight
) -> Middleware:
    """Log and (with ``metrics``) count every request, and keep ``in_flight`` (what a
    shutdown waits for) while it is handled; place it first in the list."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500  # only if something escapes the error middleware
        in_flight.count += 1
        try:
            response = await handler(request)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            in_flight.count -= 1
            seconds = time.perf_counter() - started
            route = route_template(request)
            if metrics is not None:
                method = request.method if request.method in _METHODS else "other"
                metrics.observe_request(route, method, status, seconds)
                outcome = request.get(AUTH_OUTCOME)
                if outcome is not None:
                    metrics.observe_auth(outcome)
            if logger.isEnabledFor(logging.INFO):
                # As logger.info would, less the walk up the stack for a caller nobody logs.
                fields = _fields(request, route, status, seconds)
                logger.handle(
                    logger.makeRecord(
                        logger.name, logging.INFO, __file__, 0, "request", (), None, extra=fields
                    )
                )

    return middleware
