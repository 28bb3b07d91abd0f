"""Usage view: a key's authentications over time (``keysvc.usage``)."""

from aiohttp import web

from keysvc import usage
from keysvc.auth import authorize
from keysvc.envelope import ok
from keysvc.handlers.common import path_uuid, query
from keysvc.queries import UsageQuerySchema
from keysvc.responses import UsageSchema
from keysvc.routes import KEY_USAGE, serves
from keysvc.schemas import load
from keysvc.state import CLOCK, STORE

_query = UsageQuerySchema()
_usage = UsageSchema()


@serves(KEY_USAGE)
async def key_usage(request: web.Request) -> web.Response:
    organization_id = path_uuid(request, "organizationId")
    authorize(request, organization_id, KEY_USAGE.needs)
    key_id = path_uuid(request, "keyId")
    params = load(_query, query(request))
    series = await usage.key_usage(
        request.app[STORE], organization_id, key_id, params, request.app[CLOCK]()
    )
    return ok(request, _usage.dump(series))
