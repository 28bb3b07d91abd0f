"""Forward-auth verification for the services next to keysvc.

Any method, so it serves as nginx ``auth_request``, Traefik ``ForwardAuth`` and
an Envoy ``ext_authz`` HTTP service alike. The caller's forwarded
``Authorization`` was already checked by the auth middleware, with the same
rules as the management API (secret, state, expiry, IP access list, rate
limits). Here only the permission the proxy asks for is checked. Success is
200 with an empty body and headers the proxy can pass upstream; failures are
envelopes, so whoever reads the proxy's logs sees why.
"""

from aiohttp import web

from keysvc.auth import authorize_permission
from keysvc.errors import BadRequest
from keysvc.permissions import MAX_PERMISSION_LENGTH, PERMISSION
from keysvc.state import CALLER

routes = web.RouteTableDef()


@routes.route("*", "/v1/verify")
async def verify(request: web.Request) -> web.Response:
    caller = request[CALLER]
    needed = request.headers.get("X-Required-Permission") or request.query.get("permission")
    if needed is not None:
        if len(needed) > MAX_PERMISSION_LENGTH or not PERMISSION.fullmatch(needed):
            raise BadRequest("permission: must be namespace:action, such as reports:read")
        authorize_permission(request, needed)
    return web.Response(
        status=200,
        headers={
            "X-Key-Id": caller.id,
            "X-Organization-Id": caller.organization_id,
            "X-Key-Permissions": ",".join(sorted(caller.permissions)),
        },
    )
