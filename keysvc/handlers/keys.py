"""Key views: list, create, read, update and delete keys of an organization."""

from aiohttp import web

from keysvc import keys
from keysvc.auth import authorize
from keysvc.errors import BadRequest, NotFound
from keysvc.handlers.common import ok, path_uuid, query, read_json_object
from keysvc.models import Key
from keysvc.schemas import (
    ApiKeySchema,
    CreateKeyResultSchema,
    CreateKeySchema,
    ListKeysQuerySchema,
    PatchKeySchema,
    load,
)
from keysvc.state import CLOCK, HASHER, SETTINGS, STORE

routes = web.RouteTableDef()
KEYS = "/v1/organizations/{organizationId}/keys"
KEY = KEYS + "/{keyId}"

_api_key = ApiKeySchema()
_api_keys = ApiKeySchema(many=True)
_create_result = CreateKeyResultSchema()
_list_query = ListKeysQuerySchema()


@routes.get(KEYS)
async def list_keys(request: web.Request) -> web.Response:
    organization_id = path_uuid(request, "organizationId")
    authorize(request, organization_id, "keys:read")
    params = load(_list_query, query(request))
    hasher = request.app[HASHER]
    after = keys.decode_cursor(hasher, organization_id, params.get("cursor"))
    page = await request.app[STORE].list_keys(organization_id, after, params["limit"])
    return ok(
        request,
        _api_keys.dump(page.keys),
        nextCursor=keys.next_cursor(hasher, organization_id, page),
        totalCount=page.total,
    )


@routes.post(KEYS)
async def create_key(request: web.Request) -> web.Response:
    organization_id = path_uuid(request, "organizationId")
    caller = authorize(request, organization_id, "keys:create")
    now = request.app[CLOCK]()
    data = load(CreateKeySchema(now=now), await read_json_object(request))
    issued = await keys.create_key(
        request.app[STORE],
        request.app[HASHER],
        caller,
        organization_id,
        data,
        now,
        request.app[SETTINGS].max_keys_per_org,
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
    return _key_response(request, key)


@routes.patch(KEY)
async def update_key(request: web.Request) -> web.Response:
    organization_id = path_uuid(request, "organizationId")
    caller = authorize(request, organization_id, "keys:update")
    key_id = path_uuid(request, "keyId")
    data = load(PatchKeySchema(now=request.app[CLOCK]()), await read_json_object(request))
    if_match = request.headers.get("If-Match")
    tags = None if if_match is None else [tag.strip() for tag in if_match.split(",")]
    key = await keys.update_key(request.app[STORE], caller, organization_id, key_id, data, tags)
    return _key_response(request, key)


def _key_response(request: web.Request, key: Key) -> web.Response:
    """The key in the envelope, with its ETag for a later If-Match."""
    response = ok(request, _api_key.dump(key))
    response.etag = key.etag.strip('"')  # aiohttp adds the quotes back
    return response


@routes.delete(KEY)
async def delete_key(request: web.Request) -> web.Response:
    organization_id = path_uuid(request, "organizationId")
    caller = authorize(request, organization_id, "keys:delete")
    key_id = path_uuid(request, "keyId")
    if key_id == caller.id:
        raise BadRequest("a key cannot delete itself: use another key to delete it")
    if not await request.app[STORE].delete_key(organization_id, key_id):
        raise NotFound("key not found in this organization")
    return ok(request)
