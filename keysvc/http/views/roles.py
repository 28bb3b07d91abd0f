"""Role views: the organization's system and custom roles."""

from aiohttp import web

from keysvc.domain import roles
from keysvc.http.envelope import ok
from keysvc.http.queries import ListRolesQuerySchema
from keysvc.http.responses import RoleSchema
from keysvc.http.role_schemas import CreateRoleSchema, UpdateRoleSchema
from keysvc.http.routes import CREATE_ROLE, DELETE_ROLE, GET_ROLE, LIST_ROLES, UPDATE_ROLE, serves
from keysvc.http.schemas import load
from keysvc.http.state import CLOCK, HASHER, SETTINGS, STORE
from keysvc.http.views.common import actor, authorized, path_uuid, query, read_json_object

_role = RoleSchema()
_roles = RoleSchema(many=True)
_create = CreateRoleSchema()
_update = UpdateRoleSchema()
_list_query = ListRolesQuerySchema()


@serves(LIST_ROLES)
async def list_roles(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    params, hasher = load(_list_query, query(request)), request.app[HASHER]
    after = roles.decode_cursor(hasher, organization_id, params.get("cursor"))
    page = await roles.list_roles(request.app[STORE], organization_id, after, params["limit"])
    return ok(
        request,
        _roles.dump(page.roles),
        nextCursor=roles.next_cursor(hasher, organization_id, page),
        totalCount=page.total,
    )


@serves(CREATE_ROLE)
async def create_role(request: web.Request) -> web.Response:
    caller, organization_id = authorized(request)
    data = load(_create, await read_json_object(request))
    detail = await roles.create_role(
        request.app[STORE],
        caller,
        organization_id,
        data,
        request.app[CLOCK](),
        request.app[SETTINGS].max_roles_per_org,
        actor(request),
    )
    return ok(request, _role.dump(detail))


@serves(GET_ROLE)
async def get_role(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    detail = await roles.get_role(request.app[STORE], organization_id, path_uuid(request, "roleId"))
    return ok(request, _role.dump(detail))


@serves(UPDATE_ROLE)
async def update_role(request: web.Request) -> web.Response:
    caller, organization_id = authorized(request)
    role_id, store = path_uuid(request, "roleId"), request.app[STORE]
    body = await read_json_object(request)
    current = await roles.changeable_role(store, caller, organization_id, role_id)
    data = load(_update, body)
    detail = await roles.update_role(
        store, caller, current, data, request.app[CLOCK](), actor(request)
    )
    return ok(request, _role.dump(detail))


@serves(DELETE_ROLE)
async def delete_role(request: web.Request) -> web.Response:
    caller, organization_id = authorized(request)
    role_id = path_uuid(request, "roleId")
    await roles.delete_role(
        request.app[STORE], caller, organization_id, role_id, request.app[CLOCK](), actor(request)
    )
    return ok(request)
