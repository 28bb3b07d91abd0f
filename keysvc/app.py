"""The application factory. Building the app does no I/O; the database and
pepper are opened in a cleanup context at start-up and closed at shutdown."""

import logging
from collections.abc import AsyncIterator

from aiohttp import web

from keysvc.auth import auth_middleware
from keysvc.config import Settings
from keysvc.credentials import Hasher, load_pepper
from keysvc.handlers import health, keys, roles, whoami
from keysvc.middleware import error_middleware
from keysvc.state import CLOCK, HASHER, SETTINGS, STORE
from keysvc.store import Store
from keysvc.timeutil import Clock, utcnow

logger = logging.getLogger("keysvc")


async def _database(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    store = await Store.open(settings.db_path)
    try:
        hasher = Hasher(load_pepper(settings.pepper, settings.pepper_path))
        await store.check_pepper(hasher.fingerprint())
        app[STORE] = store
        app[HASHER] = hasher
        yield
    finally:
        await store.close()


def create_app(settings: Settings, *, clock: Clock = utcnow) -> web.Application:
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[error_middleware(logger=logger), auth_middleware()],
    )
    app[SETTINGS] = settings
    app[CLOCK] = clock
    app.cleanup_ctx.append(_database)
    for module in (health, keys, roles, whoami):
        app.router.add_routes(module.routes)
    return app
