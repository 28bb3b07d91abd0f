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

from keysvc import views
from keysvc.auth import authorize_permission
from keysvc.errors import BadRequest
from keysvc.permissions import MAX_PERMISSION_LENGTH, PERMISSION
from keysvc.state import CALLER

routes = web.RouteTableDef()
_HEADER = "X-Required-Permission"


def _required_permissions(request: web.Request) -> list[str]:
    """The permissions asked for: the header's and ``?permission=``'s, each of which the
    key must hold. Neither overrides the other: a proxy that forwards the client's
    headers (Traefik's ForwardAuth does by default) while naming the permission in
    the query must not let the client swap in a weaker one. Either one malformed, or
    given twice, is a 400 rather than silently ignored."""
    headers = request.headers.getall(_HEADER, [])
    # Most calls have no query string: then none is parsed.
    params = request.query.getall("permission", []) if request.query_string else []
    if len(headers) > 1 or len(params) > 1:
        raise BadRequest("permission: give it once, in X-Required-Permission or ?permission=")
    given = [value for value in headers if value] + params  # an empty header is no header
    for value in given:
        if len(value) > MAX_PERMISSION_LENGTH or not PERMISSION.fullmatch(value):
            raise BadRequest("permission: must be namespace:action, such as reports:read")
    return given


@routes.route("*", "/v1/verify")
async def verify(request: web.Request) -> web.Response:
    caller = request[CALLER]
    for needed in _required_permissions(request):
        authorize_permission(request, needed)
    return web.Response(
        status=200,
        headers={
            "X-Key-Id": caller.id,
            "X-Organization-Id": caller.organization_id,
            "X-Key-Permissions": views.permissions_header(caller),
        },
    )
