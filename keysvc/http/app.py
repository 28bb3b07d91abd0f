"""The application factory. Building the app does no I/O; the database and
pepper are opened in a cleanup context at start-up and closed at shutdown."""

import logging
from collections.abc import AsyncIterator
from datetime import timedelta

from aiohttp import web

# Imported for their views, each of which binds itself to its route (keysvc.http.routes.serves).
import keysvc.http.views.activities
import keysvc.http.views.console
import keysvc.http.views.docs
import keysvc.http.views.health
import keysvc.http.views.identities
import keysvc.http.views.imports
import keysvc.http.views.keys
import keysvc.http.views.leaks
import keysvc.http.views.metrics
import keysvc.http.views.roles
import keysvc.http.views.usage
import keysvc.http.views.verify
import keysvc.http.views.webhooks
import keysvc.http.views.whoami  # noqa: F401
from keysvc.config import Settings
from keysvc.db.backends import open_store
from keysvc.domain.imports import ImportTurns
from keysvc.domain.leaks import PendingReports
from keysvc.domain.ratelimit import FailureSketch, Limits
from keysvc.domain.sharedlimits import NETWORK_PURPOSE, SharedCounts
from keysvc.http import render
from keysvc.http.access import Access
from keysvc.http.middleware import (
    PARSER_LIMITS,
    answer_parser_errors_in_envelope,
    parser_error_log,
    service_middleware,
)
from keysvc.http.routes import METRICS as METRICS_ROUTE
from keysvc.http.routes import ROUTES, register
from keysvc.http.state import (
    CLOCK,
    HASHER,
    IMPORT_TURNS,
    IN_FLIGHT,
    KEPT_REUSE,
    KEY_STATES,
    LEAK_REPORTS,
    LIMITS,
    METRICS,
    PARSER_ERROR_LOG,
    SETTINGS,
    STORE,
    InFlight,
    KeptReuse,
)
from keysvc.metrics import KEYS_COUNTED_EVERY_SECONDS, Metrics
from keysvc.ops.delivery import Deliverer
from keysvc.timeutil import Clock, utcnow

logger = logging.getLogger("keysvc")
access_logger = logging.getLogger("keysvc.access")


async def _database(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    metrics = app.get(METRICS)
    observer = metrics.observe_db if metrics else None
    opened = open_store(settings, observer=observer, serving=True, records=render.STORE_RECORDS)
    async with opened as (store, hasher):
        routed = getattr(store, "routed", None)  # PostgreSQL's reads, with replicas
        if metrics is not None and routed is not None:
            metrics.watch_reads(routed)
        app[STORE] = store
        app[HASHER] = hasher
        yield


async def _webhooks(app: web.Application) -> AsyncIterator[None]:
    """After ``_database``, so stopped before it: the delivery task gives its leases
    back through the store."""
    deliverer = Deliverer(app[STORE], app[HASHER], app[SETTINGS], app[CLOCK])
    await deliverer.start()
    try:
        yield
    finally:
        await deliverer.close()


async def _key_states(app: web.Application) -> AsyncIterator[None]:
    """After ``_database``, so closed before it: no count outlives the store."""
    metrics = app[METRICS]
    every = timedelta(seconds=KEYS_COUNTED_EVERY_SECONDS)
    states = app[STORE].key_counts(every, metrics.observe_db)
    app[KEY_STATES] = states
    try:
        yield
    finally:
        await states.close()


async def _shared_limits(app: web.Application) -> AsyncIterator[None]:
    """After ``_database``, so closed before it: the last counts go through its store."""
    store = app[STORE].shared_counts()
    if store is None:
        yield  # one process serves this database, and counts in its own memory
        return
    clock = app[CLOCK]
    shared = SharedCounts(
        store,
        app[HASHER].derive(NETWORK_PURPOSE),
        app[SETTINGS].auth_failures,
        clock=lambda: clock().timestamp(),
    )
    shared.start()
    app[LIMITS].shared = shared
    try:
        yield
    finally:
        app[LIMITS].shared = None
        await shared.close()


async def _leak_reports(app: web.Application) -> AsyncIterator[None]:
    """After ``_database``, so stopped before it closes: a report not acted on yet stays
    in the database for the next start (or another instance)."""
    reports = PendingReports(app[STORE], app[CLOCK])
    app[LEAK_REPORTS] = reports
    reports.start()
    try:
        yield
    finally:
        await reports.close()


def create_app(
    settings: Settings, *, clock: Clock = utcnow, failures: FailureSketch | None = None
) -> web.Application:
    # Per app, never the process-wide registry: tests build many apps in one process.
    metrics = Metrics() if settings.metrics else None
    in_flight = InFlight()
    answer_parser_errors_in_envelope()
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        # Applied by every runner: `keysvc serve` and the tests' server alike.
        handler_args=PARSER_LIMITS,
        middlewares=[
            service_middleware(
                logger=logger,
                access=Access(access_logger, metrics, settings.access_log),
                in_flight=in_flight,
            )
        ],
    )
    app[SETTINGS] = settings
    app[CLOCK] = clock
    app[LIMITS] = Limits(failures or FailureSketch.of(settings))
    app[IN_FLIGHT] = in_flight
    app[KEPT_REUSE] = KeptReuse()
    app[IMPORT_TURNS] = ImportTurns()
    app[PARSER_ERROR_LOG] = parser_error_log(logger)
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_leak_reports)
    app.cleanup_ctx.append(_webhooks)
    if settings.shared_limits:
        app.cleanup_ctx.append(_shared_limits)
    # /metrics is served only when metrics are on; otherwise it is an ordinary 404.
    register(app.router, tuple(r for r in ROUTES if metrics is not None or r is not METRICS_ROUTE))
    if metrics is not None:
        app[METRICS] = metrics
        app.cleanup_ctx.append(_key_states)
    return app
