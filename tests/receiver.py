"""A real webhook receiver for the tests: an aiohttp server on a loopback port that
records what it is sent and answers as told (2xx, 500, a redirect, or not at all); a
tarpit, a bare TCP server that reads a request's first line and never answers; a
signature check written from docs/concepts/events.md's description, apart from keysvc's code; and
the Standard Webhooks library's check."""

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from tests.server import free_port


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    status: int  # what the receiver answered

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


def signature_valid(secret: str, received: Received, tolerance: float = 300) -> bool:
    """The receiver's check, as docs/concepts/events.md describes it: t and v2 from
    Keysvc-Signature, HMAC-SHA256 keyed with the secret over "<t>.<event ID>.<event
    type>.<raw body>" (the Keysvc-Event-Id and Keysvc-Event-Type headers), compared in
    constant time, and t within ``tolerance`` seconds of now."""
    parts = dict(
        item.split("=", 1)
        for item in received.headers["Keysvc-Signature"].split(",")
        if "=" in item
    )
    timestamp = int(parts["t"])
    event = (received.headers["Keysvc-Event-Id"], received.headers["Keysvc-Event-Type"])
    signed = ".".join([str(timestamp), *event]).encode() + b"." + received.body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return abs(time.time() - timestamp) <= tolerance and hmac.compare_digest(expected, parts["v2"])


def standard_valid(secret: str | bytes, body: bytes, headers: dict[str, str]) -> bool:
    """Whether the ``standardwebhooks`` package's check accepts the request."""
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


class Receiver:
    """Answers ``status`` (204 by default); with ``hang`` set, answers nothing until
    ``release`` is set. Every request is kept in ``received``."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/hooks"
        self.status = 204
        self.hang = False
        self.release = asyncio.Event()
        self.received: list[Received] = []
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        status = self.status  # as recorded, whatever a test sets meanwhile
        async with self._changed:
            self.received.append(Received(dict(request.headers), body, status))
            self._changed.notify_all()
        if self.hang:
            await self.release.wait()
        if 300 <= status < 400:
            return web.Response(status=status, headers={"Location": "http://127.0.0.1:9/"})
        return web.Response(status=status)

    async def start(self) -> "Receiver":
        app = web.Application()
        app.router.add_post("/hooks", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def wait_for(
        self, done: Callable[[list[Received]], bool], timeout: float = 30
    ) -> list[Received]:
        """Wait until ``done(received)``; fail after ``timeout`` seconds."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: done(self.received)), timeout)
        return list(self.received)

    def events(self, event_type: str | None = None) -> list[dict[str, Any]]:
        return [r.event for r in self.received if event_type in (None, r.event["type"])]


class Tarpit:
    """A receiver that never answers: it accepts every connection, reads the request
    line, and holds the connection open, silent, until stopped. ``open`` holds the
    path of each request under way; ``most`` and ``most_per_path`` how many there
    ever were at once, in all and for one path."""

    def __init__(self) -> None:
        self.port = free_port()
        self.open: list[str] = []
        self.most = 0
        self.most_per_path = 0
        self._server: asyncio.Server | None = None
        self._held: set[asyncio.StreamWriter] = set()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._held.add(writer)
        path = ""
        try:
            line = (await reader.readline()).decode(errors="replace").split()
            path = line[1] if len(line) > 1 else ""
            self.open.append(path)
            self.most = max(self.most, len(self.open))
            self.most_per_path = max(self.most_per_path, self.open.count(path))
            while await reader.read(4096):  # until the client gives up
                pass
        finally:
            if path in self.open:
                self.open.remove(path)
            self._held.discard(writer)
            writer.close()

    async def start(self) -> "Tarpit":
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", self.port)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._held):
                writer.close()
            await self._server.wait_closed()
            self._server = None
