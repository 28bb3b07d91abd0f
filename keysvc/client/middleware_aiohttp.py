"""keysvc in front of an aiohttp service's handlers: ``keysvc_middleware`` (a factory
with keyword-only options, as aiohttp's own) checks each request with a
``keysvc.client.verifier.Verifier`` and puts the caller on the request under
``CALLER`` (``request[CALLER]``), or answers keysvc's refusal itself.

``permission``: the permission every request needs, or a callable that names it per
request (None: any key); ``public``: a callable that lets a request through unchecked
(a health check, say). ``setup`` closes the verifier's connections with the app."""

from collections.abc import AsyncIterator, Callable

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from keysvc.client.records import Caller
from keysvc.client.verifier import Refusal, Verifier

CALLER = web.RequestKey("keysvc_caller", Caller)


def keysvc_middleware(
    *,
    verifier: Verifier,
    permission: str | Callable[[web.Request], str | None] | None = None,
    public: Callable[[web.Request], bool] | None = None,
) -> Middleware:
    per_request = permission if callable(permission) else None
    fixed = None if callable(permission) else permission

    @web.middleware
    async def keysvc_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if public is not None and public(request):
            return await handler(request)
        needed = fixed if per_request is None else per_request(request)
        address = request.remote if verifier.forward_client_address else None
        given = request.headers.getall(hdrs.AUTHORIZATION, ())
        found = verifier.reused(given, needed, address)
        if found is None:  # not kept: keysvc is asked (or the request refused)
            checked = await verifier.check(given, needed, address)
            if isinstance(checked, Refusal):
                return web.Response(
                    status=checked.status, body=checked.body, headers=checked.headers
                )
            found = checked
        request[CALLER] = found
        return await handler(request)

    return keysvc_auth


def setup(
    app: web.Application,
    verifier: Verifier,
    *,
    permission: str | Callable[[web.Request], str | None] | None = None,
    public: Callable[[web.Request], bool] | None = None,
) -> None:
    """Add ``keysvc_middleware`` to ``app`` with these options, and close the verifier's
    connections when the app stops."""

    async def close(_: web.Application) -> AsyncIterator[None]:
        yield
        await verifier.close()

    app.middlewares.append(
        keysvc_middleware(verifier=verifier, permission=permission, public=public)
    )
    app.cleanup_ctx.append(close)
