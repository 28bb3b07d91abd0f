"""The Prometheus scrape endpoint. It takes no key: with a metrics token set
(``KEYSVC_METRICS_TOKEN``) it asks for that token as a bearer token, else it
answers anyone. Registered only when metrics are on; otherwise ``/metrics`` is
an ordinary 404. It is served whether or not the database answers: the keys by state
are then the last count made (``keysvc_keys_counted`` says so)."""

from aiohttp import web

from keysvc.errors import ServiceUnavailable
from keysvc.http.auth import check_bearer
from keysvc.http.routes import METRICS as ROUTE
from keysvc.http.routes import serves
from keysvc.http.state import CLOCK, KEY_STATES, METRICS, SETTINGS
from keysvc.metrics import CONTENT_TYPE


@serves(ROUTE)
async def metrics(request: web.Request) -> web.Response:
    """Every metric of this app; keys by state as last counted (``keysvc.db.keystates``)."""
    check_bearer(request, request.app[SETTINGS].metrics_token)
    exported = request.app[METRICS]
    try:
        counts = await request.app[KEY_STATES].counts(request.app[CLOCK]())
    except ServiceUnavailable:  # the database is down or closing: the rest still counts
        counts = None
    exported.set_keys_by_state(counts)
    return web.Response(body=exported.render(), headers={"Content-Type": CONTENT_TYPE})
