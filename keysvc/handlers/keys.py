"""Key views: create a key, read one key."""

from aiohttp import web

from keysvc import keys
from keysvc.auth import authorize
from keysvc.errors import NotFound
from keysvc.handlers.common import ok, path_uuid, read_json_object
from keysvc.schemas import ApiKeySchema, CreateKeyResultSchema, CreateKeySchema, load
from keysvc.state import CLOCK, HASHER, STORE

routes = web.RouteTableDef()
KEYS = "/v1/organizations/{organizationId}/keys"
KEY = KEYS + "/{keyId}"

_api_key = ApiKeySchema()
_create_result = CreateKeyResultSchema()


@routes.post(KEYS)
async def create_key(request: web.Request) -> web.Response:
    organization_id = path_uuid(request, "organizationId")
    authorize(request, organization_id, "keys:create")
    now = request.app[CLOCK]()
    data = load(CreateKeySchema(now=now), await read_json_object(request))
    issued = await keys.create_key(
        request.app[STORE], request.app[HASHER], organization_id, data, now
    )
    # With hashData the client chose its own credentials: none are echoed.
    result: dict[str, object] = {"key": issued.key}
    if issued.key_id is not None:
        result.update(keyId=issued.key_id, keySecret=issued.secret)
    return ok(request, _create_result.dump(result))


@routes.get(KEY)
async def get_key(request: web.Request) -> web.Response:
    organization_id = path_uuid(request, "organizationId")
    authorize(request, organization_id, "keys:read")
    key = await request.app[STORE].get_key(organization_id, path_uuid(request, "keyId"))
    if key is None:
        raise NotFound("key not found in this organization")
    return ok(request, _api_key.dump(key))
