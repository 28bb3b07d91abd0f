"""Who am I: the calling key, so a client can tell which key it is using."""

from aiohttp import web

from keysvc.handlers.common import ok
from keysvc.schemas import WhoAmISchema
from keysvc.state import CALLER

routes = web.RouteTableDef()
_whoami = WhoAmISchema()


@routes.get("/v1/whoami")
async def whoami(request: web.Request) -> web.Response:
    return ok(request, _whoami.dump(request[CALLER]))
