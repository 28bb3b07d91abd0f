"""The benchmark's baseline (A): a bare aiohttp app on keysvc's paths.

No authentication, no database, no middleware: each route answers a canned
response whose body and headers were captured from keysvc for that scenario
(``shapes.json``, written by bench/run.py), so both apps send the same number
of bytes. Only the ``X-Request-Id`` header is fresh on every answer, as keysvc's is.

    python -m bench.baseline --port 8081 --shapes shapes.json [--loop uvloop]
"""

import argparse
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import uvloop
from aiohttp import web

from keysvc.config import LOOPS

KEYS = "/v1/organizations/{organizationId}/keys"
ROUTES = {
    "get": ("GET", KEYS + "/{keyId}"),
    "verify": ("GET", "/v1/verify"),
    "create": ("POST", KEYS),
    "list": ("GET", KEYS),
}


@dataclass(frozen=True)
class Shape:
    """A canned answer: status, headers (Content-Type included) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def as_json(self) -> dict[str, object]:
        return {"status": self.status, "headers": self.headers, "body": self.body.decode()}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> "Shape":
        headers = data["headers"]
        if not isinstance(headers, dict):
            raise ValueError("a shape's headers must be an object")
        plain = {str(name): str(value) for name, value in headers.items()}
        return cls(int(str(data["status"])), plain, str(data["body"]).encode())


def load_shapes(path: Path) -> dict[str, Shape]:
    return {name: Shape.from_json(data) for name, data in json.loads(path.read_text()).items()}


def replay_shape(shape: Shape) -> Callable[[web.Request], Awaitable[web.Response]]:
    """A's view: ``shape``, with a fresh ``X-Request-Id``."""

    async def view(request: web.Request) -> web.Response:
        if request.can_read_body:
            await request.read()
        headers = {**shape.headers, "X-Request-Id": str(uuid.uuid4())}
        return web.Response(status=shape.status, headers=headers, body=shape.body)

    return view


def create_app(shapes: dict[str, Shape]) -> web.Application:
    """Each of ROUTES, answering its scenario's shape."""
    app = web.Application()
    for name, (method, path) in ROUTES.items():
        app.router.add_route(method, path, replay_shape(shapes[name]))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description="The benchmark's bare aiohttp baseline.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--shapes", type=Path, required=True, help="shapes.json from bench.run")
    parser.add_argument("--loop", choices=LOOPS, default="asyncio", help="event loop (asyncio)")
    args = parser.parse_args()
    app = create_app(load_shapes(args.shapes))
    # The same loop as keysvc's under test (KEYSVC_LOOP), so that B/A compares the apps.
    loop = uvloop.new_event_loop() if args.loop == "uvloop" else None
    web.run_app(app, host=args.host, port=args.port, access_log=None, print=None, loop=loop)


if __name__ == "__main__":
    main()
