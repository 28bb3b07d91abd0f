"""The Prometheus scrape endpoint, without credentials. Registered only when
metrics are on; otherwise ``/metrics`` is an ordinary 404."""

from aiohttp import web

from keysvc.auth import public
from keysvc.metrics import CONTENT_TYPE
from keysvc.state import CLOCK, METRICS, STORE

routes = web.RouteTableDef()


@routes.get("/metrics")
@public
async def metrics(request: web.Request) -> web.Response:
    """Every metric of this app; the keys-by-state gauge is read from the database now."""
    exported = request.app[METRICS]
    exported.set_keys_by_state(await request.app[STORE].count_keys_by_state(request.app[CLOCK]()))
    return web.Response(body=exported.render(), headers={"Content-Type": CONTENT_TYPE})
