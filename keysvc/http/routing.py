"""What a route is and how its view is bound: the ``Route`` declaration, ``serves``
(one view per route), the lookups the middleware and the app make by view or by route,
and ``register``, which adds the declared routes to aiohttp's router. The routes
themselves are declared in ``keysvc.http.routes``."""

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from marshmallow import Schema

from keysvc.errors import BadRequest
from keysvc.http.schemas import UUID_PATTERN

View = Callable[[web.Request], Awaitable[web.StreamResponse]]

ORG = "/v1/organizations/{organizationId}"

# What any authenticated operation may answer besides its success; a write may also
# be refused whole for a full disk.
AUTHENTICATED = (400, 401, 403, 429, 500)
WRITE = (*AUTHENTICATED, 507)
DONE = "Done: the envelope has no result."


@dataclass(frozen=True, eq=False)
class Route:
    """One operation. ``permission``: what the caller's key must hold, in the organization
    the path names, checked before the view runs (``keysvc.http.auth.guarded``). None
    with ``public`` False: any admitted key may call it (whoami, verify, which checks
    what the proxy asks for itself)."""

    method: str  # "*" for any method
    path: str
    operation_id: str
    summary: str
    tag: str = "keys"
    permission: str | None = None
    public: bool = False
    body: type[Schema] | None = None
    body_required: bool = True  # False: the body may be left out, as if it were {}
    # The 200's result: a schema, many of it when ``paged`` names what totalCount counts.
    response: type[Schema] | None = None
    paged: str | None = None
    many: bool = False  # the 200's result is a whole list of ``response``, unpaged
    answer: str = ""  # what the 200 says it is
    statuses: tuple[int, ...] = ()  # every other status it may answer
    description: str | None = None
    if_match: bool = False  # takes If-Match against the key's ETag
    # A public envelope whose result is an object of these string fields.
    fields: tuple[str, ...] = ()
    # A success that is no envelope, of this media type.
    media_type: str | None = None
    # The query parameters it takes besides a list's paging, as a schema.
    query: type[Schema] | None = None


_HANDLERS: dict[Route, View] = {}
# The route each view serves: asked on every request, so one dict lookup.
_ROUTES: dict[object, Route] = {}


def serves(route: Route) -> Callable[[View], View]:
    """Bind the decorated view to ``route``: one view per route. A route's permission is
    checked for the organization its path names, so it needs one there."""
    if route.permission is not None and "{organizationId}" not in route.path:
        raise ValueError(f"{route.operation_id}: a permission needs an organization path")

    def bind(view: View) -> View:
        if route in _HANDLERS:
            raise ValueError(f"{route.operation_id} already has a view")
        _HANDLERS[route] = view
        _ROUTES[view] = route
        return view

    return bind


def route_of(view: object) -> Route | None:
    """The route ``view`` serves; None for a view no route declares."""
    return _ROUTES.get(view)


def handler_of(route: Route) -> View:
    """The view bound to ``route`` (its handler module must have been imported)."""
    return _HANDLERS[route]


def is_public(view: object) -> bool:
    """Whether ``view`` serves a route that needs no credentials; an undeclared view
    is never public."""
    route = _ROUTES.get(view)
    return route is not None and route.public


# The declared paths whose last segment is literal (``/keys/import`` beside
# ``/keys/{keyId}``), each parameter any one segment, with their methods.
_LITERAL_PATHS: dict[str, tuple[re.Pattern[str], set[str]]] = {}


def literal_methods(path: str) -> list[str] | None:
    """The methods of the declared literal path ``path`` is (``.../keys/import``), or
    None: aiohttp's 405 there names the methods of ``.../keys/{keyId}`` too."""
    for pattern, methods in _LITERAL_PATHS.values():
        if pattern.fullmatch(path):
            return sorted(methods)
    return None


def path_uuid(request: web.Request, name: str) -> str:
    """A path parameter that must be a UUID in canonical lowercase form. A literal
    path declared beside it (``.../keys/import`` for ``.../keys/{keyId}``) asked with
    a method it does not serve is a 405, as any undeclared method is."""
    value = request.match_info[name]
    if not UUID_PATTERN.fullmatch(value):
        resource = request.match_info.route.resource
        last = (resource.canonical if resource else "").rpartition("/")[2]
        methods = literal_methods(request.path) if last == "{" + name + "}" else None
        if methods:
            raise web.HTTPMethodNotAllowed(request.method, methods)
        raise BadRequest(
            f"{name}: must be a lowercase UUID such as 123e4567-e89b-42d3-a456-426614174000"
        )
    return value


def register(router: web.UrlDispatcher, routes: tuple[Route, ...]) -> None:
    """Add ``routes`` to ``router``, each with its view; a GET answers HEAD too."""
    for route in routes:
        view = handler_of(route)
        if "{" not in route.path.rpartition("/")[2]:
            methods = {route.method, "HEAD"} if route.method == "GET" else {route.method}
            pattern = re.compile(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(route.path)))
            _LITERAL_PATHS.setdefault(route.path, (pattern, set()))[1].update(methods)
        if route.method == "GET":
            router.add_get(route.path, view)
        else:
            router.add_route(route.method, route.path, view)
