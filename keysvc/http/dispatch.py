"""The handler keysvc's runners give aiohttp's server: a verify goes straight to keysvc's
middleware and its view; every other request goes through the application as usual.

aiohttp's ``Application`` finds each request's route (the router's walk, a match made and
frozen), then runs the middleware chain it builds around the view, with a middleware of
its own that sets the request's current application: some 10 us a request, 8% of a plain
``/v1/verify`` (docs/PERFORMANCE.md, "Session 42"). The verify path's answer from the
router never changes: one route, of any method, with no variable part. So it is resolved
once, when the server is made, and each verify is given that same frozen match and sent
through keysvc's one middleware to the view, exactly as the application would.

Taken only where the router's answer is certain (``_verify_route``): the application has
keysvc's single middleware, no sub-application, and one resource at ``/v1/verify`` whose
one route takes any method; and only for a request whose path the router would look up
as ``/v1/verify`` (its ``path_safe``, which decodes ``%76erify`` as the router does)
without an ``Expect`` header (whose answer the application leaves to the route).
Anything else (a trailing slash, ``%2F``, another case) goes through the application,
which answers it as it always did. A request aiohttp could not make (``_Requests``) is
answered 400 here, as a parser error is.
"""

from typing import Any, NamedTuple

from aiohttp import hdrs, web
from aiohttp.http_exceptions import InvalidURLError
from aiohttp.typedefs import Handler, Middleware
from yarl import URL

from keysvc.http.routes import VERIFY

# The URL a request is made with when its own cannot be (``DispatchRunner``): relative,
# so the request keeps this very object as its ``rel_url``, and is known by it.
_UNREADABLE = URL.build(path="/")


class _Direct(NamedTuple):
    """What a verify is answered with, past the router: the route's match (made once,
    frozen), keysvc's one middleware, and the view."""

    match: web.UrlMappingMatchInfo
    middleware: Middleware
    view: Handler


class Dispatch:
    """``app``'s handler for aiohttp's server: ``handle``."""

    __slots__ = ("_direct", "_handle", "app")

    def __init__(self, app: web.Application):
        self.app = app
        self._handle = app._handle  # the application's own: the router, then the chain
        self._direct: _Direct | None = None
        found = _verify_route(app)
        if found is not None:
            match = web.UrlMappingMatchInfo({}, found)
            match.add_app(app)
            match.freeze()  # as the application freezes each: nothing may change it
            self._direct = _Direct(match, app.middlewares[0], found.handler)

    @property
    def direct(self) -> bool:
        """Whether verifies skip the router (``_verify_route`` found its one route)."""
        return self._direct is not None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """The answer to ``request``: a verify's from the middleware and view directly,
        any other's from the application."""
        direct = self._direct
        if (
            direct is not None
            and request.rel_url.path_safe == VERIFY.path
            and hdrs.EXPECT not in request.headers
        ):
            assert isinstance(request, web.Request)  # the application's request factory's
            request._match_info = direct.match
            return await direct.middleware(request, direct.view)
        if request.rel_url is _UNREADABLE:
            # Answered as aiohttp's parser errors are (keysvc.http.middleware's
            # handle_error): a 400 envelope, the connection closed.
            return request.protocol.handle_error(request, 400, InvalidURLError("unreadable"))
        return await self._handle(request)  # type: ignore[arg-type]


def _verify_route(app: web.Application) -> web.ResourceRoute | None:
    """The route the router gives every request for ``/v1/verify``, where that is certain:
    the application runs one middleware and has no sub-application, and one resource
    answers that path, with one route of any method. None otherwise."""
    if len(app.middlewares) != 1 or getattr(app.middlewares[0], "__middleware_version__", 0) != 1:
        return None
    found = None
    for resource in app.router.resources():
        if isinstance(resource, web.PrefixedSubAppResource):  # add_domain's included
            return None
        if resource.canonical != VERIFY.path:
            continue
        routes = list(resource)
        if found is not None or len(routes) != 1 or routes[0].method != hdrs.METH_ANY:
            return None
        route = routes[0]
        if not isinstance(route, web.ResourceRoute) or not isinstance(resource, web.PlainResource):
            return None
        found = route
    return found


class DispatchRunner(web.AppRunner):
    """``web.AppRunner`` whose server answers through ``Dispatch``, and makes a request
    of any head the parser took (``_Requests``)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.request_handler = Dispatch(self.app).handle
        server.request_factory = _Requests(server.request_factory).make
        return server


class _Requests:
    """The application's request factory, for a target it cannot make a request of too.

    An absolute-form target whose host yarl cannot decode (``GET http://xn--zz/
    HTTP/1.1``) makes aiohttp's request raise, which ends the connection's handler
    without an answer and leaves the connection open for good: anyone could hold every
    connection slot with one line each (rt52 F1). Such a request is made with
    ``_UNREADABLE`` for its URL instead, and ``Dispatch.handle`` answers it 400."""

    __slots__ = ("_factory",)

    def __init__(self, factory: Any):
        self._factory = factory

    def make(self, message: Any, *args: Any) -> web.BaseRequest:
        try:
            request: web.BaseRequest = self._factory(message, *args)
        except ValueError:  # UnicodeError included
            request = self._factory(message._replace(url=_UNREADABLE), *args)
        return request
