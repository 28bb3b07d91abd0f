"""Usage view: a key's authentications over time (``keysvc.domain.usage``)."""

from aiohttp import web

from keysvc.domain import usage
from keysvc.http.envelope import ok
from keysvc.http.queries import UsageQuerySchema
from keysvc.http.responses import UsageSchema
from keysvc.http.routes import KEY_USAGE, serves
from keysvc.http.schemas import load
from keysvc.http.state import CLOCK, STORE
from keysvc.http.views.common import authorized, path_uuid, query

_query = UsageQuerySchema()
_usage = UsageSchema()


@serves(KEY_USAGE)
async def key_usage(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    key_id = path_uuid(request, "keyId")
    params = load(_query, query(request))
    series = await usage.key_usage(
        request.app[STORE], organization_id, key_id, params, request.app[CLOCK]()
    )
    return ok(request, _usage.dump(series))
