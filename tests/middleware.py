"""What the middleware tests (tests/system/test_middleware*.py) share: a real
``keysvc serve`` with its admin, keys made through its API, the count of verify
requests that reached it (its request metrics), and hello-world services behind
keysvc.client's middlewares."""

import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from keysvc.client import CALLER, Caller, KeysvcMiddleware, Verifier, keysvc_middleware
from tests.helpers import Creds
from tests.nginx import admin_api, create_key
from tests.server import Server, admin_creds, bootstrap

VERIFIED = re.compile(
    r'^keysvc_http_requests_total\{[^}]*route="/v1/verify"[^}]*\} ([0-9.]+)$', re.M
)
# What the services below need, by path: /reports needs reports:read; / any key.
PERMISSIONS = {"/reports": "reports:read"}


@dataclass(frozen=True)
class Keysvc:
    server: Server
    admin: Creds

    @property
    def base(self) -> str:
        return self.server.base

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """keysvc's API as the admin, under its organization: the answer's result."""
        return admin_api(self.server.port, self.admin, method, path, body)

    def create_key(self, **fields: Any) -> Creds:
        return create_key(self.server.port, self.admin, **fields)

    def verified(self) -> int:
        """How many verify requests reached keysvc so far, by its metrics."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as answer:
            text = answer.read().decode()
        return int(sum(float(count) for count in VERIFIED.findall(text)))


def running_keysvc(directory: Path, env: dict[str, str] | None = None) -> Iterator[Keysvc]:
    db = directory / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    with Server(db, env=env) as server:
        yield Keysvc(server, admin)


def described(caller: Caller) -> dict[str, Any]:
    """The caller as the services below answer it."""
    return {
        "keyId": caller.key_id,
        "organizationId": caller.organization_id,
        "permissions": sorted(caller.permissions),
        "externalId": caller.external_id,
        "meta": caller.meta,
        "identity": caller.identity,
        "creditsRemaining": caller.credits_remaining,
    }


def aiohttp_service(verifier: Verifier) -> web.Application:
    """Hello world behind the aiohttp middleware; /healthz is public."""

    async def hello(request: web.Request) -> web.Response:
        return web.json_response(described(request[CALLER]))

    app = web.Application(
        middlewares=[
            keysvc_middleware(
                verifier=verifier,
                permission=lambda request: PERMISSIONS.get(request.path),
                public=lambda request: request.path == "/healthz",
            )
        ]
    )

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/", hello)
    app.router.add_get("/reports", hello)
    app.router.add_get("/healthz", healthz)
    return app


def starlette_service(verifier: Verifier) -> Any:
    async def hello(request: Request) -> JSONResponse:
        assert request.scope["keysvc"] is request.state.keysvc
        return JSONResponse(described(request.state.keysvc))

    app = Starlette(routes=[Route("/", hello), Route("/reports", hello)])
    return KeysvcMiddleware(
        app, verifier=verifier, permission=lambda scope: PERMISSIONS.get(scope["path"])
    )
