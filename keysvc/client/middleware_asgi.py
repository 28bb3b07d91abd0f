"""keysvc in front of an ASGI app (Starlette, FastAPI, any other): ``KeysvcMiddleware``
checks each HTTP request and websocket with a ``keysvc.client.verifier.Verifier`` and
puts the caller in the scope, as ``scope["keysvc"]`` and in ``scope["state"]["keysvc"]``
(Starlette's ``request.state.keysvc``), or answers keysvc's refusal itself (a websocket
is closed with 1008 before it is accepted). Lifespan events pass through.

``permission``: the permission every request needs, or a callable of the scope that
names it (None: any key); ``public``: a callable of the scope that lets a request
through unchecked."""

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from keysvc.client.records import Caller
from keysvc.client.verifier import Refusal, Verifier

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _headers(scope: Scope, name: bytes) -> list[str]:
    """Every value of the header ``name`` (lower case) the request sent."""
    return [
        bytes(value).decode("latin-1")
        for key, value in scope.get("headers", ())
        if bytes(key).lower() == name
    ]


class KeysvcMiddleware:
    def __init__(
        self,
        app: App,
        *,
        verifier: Verifier,
        permission: str | Callable[[Scope], str | None] | None = None,
        public: Callable[[Scope], bool] | None = None,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.permission = permission
        self.public = public

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or (
            self.public is not None and self.public(scope)
        ):
            await self.app(scope, receive, send)
            return
        needed = self.permission(scope) if callable(self.permission) else self.permission
        client = scope.get("client")
        given = _headers(scope, b"authorization")
        address = client[0] if client else None
        found = self.verifier.reused(given, needed, address)
        if found is None:  # not kept: keysvc is asked (or the request refused)
            checked = await self.verifier.check(given, needed, address)
            if isinstance(checked, Refusal):
                await _refuse(scope, send, checked)
                return
            found = checked
        _put(scope, found)
        await self.app(scope, receive, send)


def _put(scope: Scope, caller: Caller) -> None:
    scope["keysvc"] = caller
    state = scope.setdefault("state", {})
    state["keysvc"] = caller


async def _refuse(scope: Scope, send: Send, refusal: Refusal) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    headers = [(name.lower().encode(), value.encode()) for name, value in refusal.headers.items()]
    headers.append((b"content-length", str(len(refusal.body)).encode()))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": refusal.body})
