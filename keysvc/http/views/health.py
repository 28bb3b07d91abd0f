"""Health checks for orchestrators: liveness and readiness, without credentials."""

from aiohttp import web

from keysvc.errors import DatabaseUnavailable, ServiceUnavailable
from keysvc.http.envelope import ok
from keysvc.http.routes import HEALTHZ, READYZ, serves
from keysvc.http.state import STORE


@serves(HEALTHZ)
async def healthz(request: web.Request) -> web.Response:
    """The process is alive and serving."""
    return ok(request, {"status": "ok"})


@serves(READYZ)
async def readyz(request: web.Request) -> web.Response:
    """The database answers, its schema is current, and writes are not refused for a
    full disk (``keysvc.db.sqlite.diskspace``); 503 with the reason otherwise."""
    store = request.app[STORE]
    try:
        current = await store.schema_is_current()
    except DatabaseUnavailable:
        raise ServiceUnavailable("not ready: the database does not answer") from None
    if not current:
        raise ServiceUnavailable("not ready: the database schema is not current")
    if not store.space.ready():
        raise ServiceUnavailable("not ready: the database disk is full")
    return ok(request, {"status": "ready"})
