"""The Prometheus scrape endpoint. It takes no key: with a metrics token set
(``KEYSVC_METRICS_TOKEN``) it asks for that token as a bearer token, else it
answers anyone. Registered only when metrics are on; otherwise ``/metrics`` is
an ordinary 404."""

from aiohttp import web

from keysvc.auth import check_bearer
from keysvc.metrics import CONTENT_TYPE
from keysvc.routes import METRICS as ROUTE
from keysvc.routes import serves
from keysvc.state import CLOCK, KEY_STATES, METRICS, SETTINGS


@serves(ROUTE)
async def metrics(request: web.Request) -> web.Response:
    """Every metric of this app; keys by state as last counted (``keysvc.keystates``)."""
    check_bearer(request, request.app[SETTINGS].metrics_token)
    exported = request.app[METRICS]
    exported.set_keys_by_state(await request.app[KEY_STATES].counts(request.app[CLOCK]()))
    return web.Response(body=exported.render(), headers={"Content-Type": CONTENT_TYPE})
