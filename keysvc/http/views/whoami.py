"""Who am I: the calling key, so a client can tell which key it is using."""

from aiohttp import web

from keysvc.http.envelope import ok
from keysvc.http.responses import WhoAmISchema
from keysvc.http.routes import WHOAMI, serves
from keysvc.http.state import CALLER

_whoami = WhoAmISchema()


@serves(WHOAMI)
async def whoami(request: web.Request) -> web.Response:
    return ok(request, _whoami.dump(request[CALLER]))
