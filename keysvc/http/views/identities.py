"""Identity views (issue 36): list, create, read, update, delete an organization's
identities and change their credits. Answered as
``keysvc.domain.identities.identity_view`` shapes them, with the ETag on single ones."""

from aiohttp import web

from keysvc.domain import identities
from keysvc.http.envelope import ok
from keysvc.http.identity_routes import (
    CHANGE_IDENTITY_CREDITS,
    CREATE_IDENTITY,
    DELETE_IDENTITY,
    GET_IDENTITY,
    LIST_IDENTITIES,
    UPDATE_IDENTITY,
)
from keysvc.http.identity_schemas import (
    CreateIdentitySchema,
    ListIdentitiesQuerySchema,
    UpdateIdentitySchema,
)
from keysvc.http.routes import serves
from keysvc.http.schemas import load
from keysvc.http.state import CLOCK, HASHER, STORE
from keysvc.http.views import resource
from keysvc.http.views.common import actor, authorized, path_uuid, query, read_json_object
from keysvc.models import Identity

_create = CreateIdentitySchema()
_validated = resource.validated_by(UpdateIdentitySchema())
_list_query = ListIdentitiesQuerySchema()


def _answer(request: web.Request, identity: Identity) -> web.Response:
    """The identity in the envelope, with its ETag for a later If-Match."""
    now = request.app[CLOCK]()
    response = ok(request, identities.identity_view(identities.as_of(identity, now)))
    return resource.tagged(response, identity.etag)


@serves(LIST_IDENTITIES)
async def list_identities(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    params, hasher = load(_list_query, query(request)), request.app[HASHER]
    after = identities.decode_cursor(hasher, organization_id, params.get("cursor"))
    page = await identities.list_identities(
        request.app[STORE], organization_id, after, params["limit"], params.get("externalId")
    )
    now = request.app[CLOCK]()
    return ok(
        request,
        [identities.identity_view(identities.as_of(found, now)) for found in page.identities],
        nextCursor=identities.next_cursor(hasher, organization_id, page),
        totalCount=page.total,
    )


@serves(CREATE_IDENTITY)
async def create_identity(request: web.Request) -> web.Response:
    caller, organization_id = authorized(request)
    data = load(_create, await read_json_object(request))
    identity = await identities.create_identity(
        request.app[STORE], caller, organization_id, data, request.app[CLOCK](), actor(request)
    )
    return _answer(request, identity)


@serves(GET_IDENTITY)
async def get_identity(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    identity_id = path_uuid(request, "identityId")
    return _answer(
        request, await identities.get_identity(request.app[STORE], organization_id, identity_id)
    )


@serves(UPDATE_IDENTITY)
async def update_identity(request: web.Request) -> web.Response:
    identity = await resource.update(request, "identityId", _validated, identities.update_identity)
    return _answer(request, identity)


@serves(CHANGE_IDENTITY_CREDITS)
async def change_identity_credits(request: web.Request) -> web.Response:
    identity = await resource.change_credits(request, "identityId", identities.change_credits)
    return _answer(request, identity)


@serves(DELETE_IDENTITY)
async def delete_identity(request: web.Request) -> web.Response:
    return await resource.delete(request, "identityId", identities.delete_identity)
