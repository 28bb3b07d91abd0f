"""The application factory. Building the app does no I/O; the database and
pepper are opened in a cleanup context at start-up and closed at shutdown."""

import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler

from keysvc.auth import auth_middleware
from keysvc.config import Settings
from keysvc.handlers import docs, health, keys, roles, verify, whoami
from keysvc.handlers.metrics import routes as metrics_routes
from keysvc.metrics import Metrics
from keysvc.middleware import PARSER_LIMITS, answer_parser_errors_in_envelope, error_middleware
from keysvc.observability import access_middleware
from keysvc.openapi import build_spec
from keysvc.ratelimit import Limits
from keysvc.state import (
    CLOCK,
    HASHER,
    IN_FLIGHT,
    LIMITS,
    METRICS,
    OPENAPI,
    SETTINGS,
    STORE,
    InFlight,
)
from keysvc.store import open_checked
from keysvc.timeutil import Clock, utcnow

logger = logging.getLogger("keysvc")
access_logger = logging.getLogger("keysvc.access")


async def _database(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    metrics = app.get(METRICS)
    observer = metrics.observe_db if metrics else None
    async with open_checked(settings, observer=observer) as (store, hasher):
        app[STORE] = store
        app[HASHER] = hasher
        yield


@web.middleware
async def _in_flight(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Track the request while it is handled, so a shutdown can let it finish."""
    in_flight = request.app[IN_FLIGHT]
    in_flight.count += 1
    try:
        return await handler(request)
    finally:
        in_flight.count -= 1


def create_app(settings: Settings, *, clock: Clock = utcnow) -> web.Application:
    # Per app, never the process-wide registry: tests build many apps in one process.
    metrics = Metrics() if settings.metrics else None
    answer_parser_errors_in_envelope()
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        # Applied by every runner: `keysvc serve` and the tests' server alike.
        handler_args=PARSER_LIMITS,
        # The access middleware comes first so that it sees the final status, errors included.
        middlewares=[
            _in_flight,
            access_middleware(logger=access_logger, metrics=metrics),
            error_middleware(logger=logger),
            auth_middleware(),
        ],
    )
    app[SETTINGS] = settings
    app[CLOCK] = clock
    app[LIMITS] = Limits()
    app[IN_FLIGHT] = InFlight()
    app[OPENAPI] = build_spec()
    app.cleanup_ctx.append(_database)
    for module in (docs, health, keys, roles, verify, whoami):
        app.router.add_routes(module.routes)
    if metrics is not None:
        app[METRICS] = metrics
        app.router.add_routes(metrics_routes)
    return app
