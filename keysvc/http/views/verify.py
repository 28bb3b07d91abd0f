"""Forward-auth verification for the services next to keysvc.

Any method, so it serves as nginx ``auth_request``, Traefik ``ForwardAuth`` and
an Envoy ``ext_authz`` HTTP service alike. The caller's forwarded
``Authorization`` was already checked by the auth middleware, with the same
rules as the management API (secret, state, expiry, IP access list, rate
limits). Here only what the proxy asks for is checked: the organization the key
must belong to and the permissions it must hold. Success is 200 with an empty
body and headers the proxy can pass upstream; failures are envelopes, so
whoever reads the proxy's logs sees why. Every answer says how long the proxy may
reuse it (``keysvc.http.reuse``: ``X-Accel-Expires`` and ``Cache-Control``), the
refusals' from ``keysvc.http.auth.guarded``, which sees them all.
"""

from aiohttp import web

from keysvc.domain.permissions import MAX_PERMISSION_LENGTH, PERMISSION
from keysvc.errors import BadRequest
from keysvc.http import render
from keysvc.http.auth import authorize_organization, authorize_permission
from keysvc.http.reuse import reuse_headers
from keysvc.http.routes import VERIFY, serves
from keysvc.http.schemas import UUID_PATTERN
from keysvc.http.state import CALLER

_PERMISSION = ("permission", "X-Required-Permission")
_ORGANIZATION = ("organization", "X-Required-Organization")


def _asked(request: web.Request, what: tuple[str, str]) -> list[str]:
    """The values asked for in the header and in the query parameter ``what`` names, each
    of which must be met. Neither overrides the other: a proxy that forwards the client's
    headers (Traefik's ForwardAuth does by default) while naming its requirement in the
    query must not let the client swap in a weaker one. Either given twice is a 400
    rather than a guess which one counts."""
    param, header = what
    headers = request.headers.getall(header, [])
    # Most calls have no query string: then none is parsed.
    params = request.query.getall(param, []) if request.query_string else []
    if len(headers) > 1 or len(params) > 1:
        raise BadRequest(f"{param}: give it once, in {header} or ?{param}=")
    return [value for value in headers if value] + params  # an empty header is no header


def _required_permissions(request: web.Request) -> list[str]:
    given = _asked(request, _PERMISSION)
    for value in given:
        if len(value) > MAX_PERMISSION_LENGTH or not PERMISSION.fullmatch(value):
            raise BadRequest("permission: must be namespace:action, such as reports:read")
    return given


def _required_organizations(request: web.Request) -> list[str]:
    given = _asked(request, _ORGANIZATION)
    for value in given:
        if not UUID_PATTERN.fullmatch(value):
            raise BadRequest(
                "organization: must be an organization ID, a lowercase UUID such as"
                " 123e4567-e89b-42d3-a456-426614174000"
            )
    return given


@serves(VERIFY)
async def verify(request: web.Request) -> web.Response:
    caller = request[CALLER]
    organizations, permissions = _required_organizations(request), _required_permissions(request)
    for organization in organizations:
        authorize_organization(request, organization, "required")
    for needed in permissions:
        authorize_permission(request, needed)
    return web.Response(
        status=200,
        headers={
            **reuse_headers(request, 200),
            "X-Key-Id": caller.id,
            "X-Organization-Id": caller.organization_id,
            "X-Key-Permissions": render.permissions_header(caller),
        },
    )
