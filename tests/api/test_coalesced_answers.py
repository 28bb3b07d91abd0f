"""``keysvc serve``'s runner sends the answers of one turn of its loop together
(``keysvc.http.coalesce``). Through that runner, on real sockets: many connections at
once, each sending requests pipelined (a verify, a 404, the 250 KB OpenAPI
document between small answers), get every answer whole and in order while the
answers are being held; one client alone is never held."""

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from keysvc.config import Settings
from keysvc.http import coalesce
from keysvc.http.app import create_app
from keysvc.http.coalesce import Writes
from keysvc.http.connections import ServiceRunner
from tests.helpers import Creds, FakeClock, bootstrap

CONNECTIONS = 24
ROUNDS = 3


@contextlib.asynccontextmanager
async def _serve(
    app: web.Application, settings: Settings
) -> AsyncIterator[tuple[int, Creds, ServiceRunner]]:
    """``app`` served by keysvc serve's runner on a loopback port: the port, an admin
    key of a new organization, and the runner."""
    runner = ServiceRunner(app, settings, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        yield port, await bootstrap(app), runner
    finally:
        await runner.cleanup()


@pytest.fixture
async def served(settings: Settings, clock: FakeClock) -> AsyncIterator[tuple[int, Creds]]:
    async with _serve(create_app(settings, clock=clock), settings) as (port, admin, _):
        yield port, admin


@pytest.fixture
def holds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many answers were held (``Writes.hold``), counted as the server runs."""
    counted = [0]
    real = Writes.hold

    def hold(self: Writes, *args: Any) -> None:
        counted[0] += 1
        real(self, *args)

    monkeypatch.setattr(Writes, "hold", hold)
    return counted


def _request(path: str, key_id: str | None = None, secret: str = "") -> bytes:
    auth = ""
    if key_id is not None:
        token = base64.b64encode(f"{key_id}:{secret}".encode()).decode()
        auth = f"Authorization: Basic {token}\r\n"
    return f"GET {path} HTTP/1.1\r\nHost: keysvc\r\n{auth}\r\n".encode()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    headers = {}
    for line in head[1:]:
        if line:
            name, _, value = line.partition(": ")
            headers[name.lower()] = value
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def _client(port: int, admin: Creds) -> list[tuple[int, str, Any]]:
    """ROUNDS times: five requests in one write, then their five answers, read in
    order: (status, the key a verify names or a body's first field, the body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    pipelined = b"".join(
        (
            _request("/v1/verify", admin.key_id, admin.secret),
            _request("/healthz"),
            _request("/v1/openapi.json"),
            _request("/v1/no-such-route"),
            _request("/v1/verify", admin.key_id, admin.secret),
        )
    )
    seen: list[tuple[int, str, Any]] = []
    try:
        for _ in range(ROUNDS):
            writer.write(pipelined)
            await writer.drain()
            for _ in range(5):
                status, headers, body = await asyncio.wait_for(_answer(reader), 30)
                parsed = json.loads(body) if body else None
                seen.append((status, headers.get("x-key-id", ""), parsed))
    finally:
        writer.close()
    return seen


async def test_held_answers_arrive_whole_and_in_order(
    served: tuple[int, Creds], holds: list[int]
) -> None:
    port, admin = served
    results = await asyncio.gather(*(_client(port, admin) for _ in range(CONNECTIONS)))
    assert holds[0] > 0, "no answer was held: the test did not exercise the holding"
    for seen in results:
        assert len(seen) == 5 * ROUNDS
        for start in range(0, len(seen), 5):
            verify, health, document, refused, again = seen[start : start + 5]
            assert verify[:2] == (200, admin.id) and again[:2] == (200, admin.id)
            assert health[0] == 200 and health[2]["status"] == 200
            assert document[0] == 200 and "openapi" in document[2] and "paths" in document[2]
            assert refused[0] == 404 and refused[2]["status"] == 404


async def test_one_client_alone_is_never_held(served: tuple[int, Creds], holds: list[int]) -> None:
    port, admin = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(20):
            writer.write(_request("/v1/verify", admin.key_id, admin.secret))
            await writer.drain()
            status, headers, _ = await asyncio.wait_for(_answer(reader), 30)
            assert (status, headers["x-key-id"]) == (200, admin.id)
    finally:
        writer.close()
    assert holds[0] == 0


async def test_an_answer_held_when_the_client_half_closes_is_sent(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's FIN arrives in the turn its answer is written and held: the answer
    goes out before the transport closes itself at the end of input (it was dropped:
    rt55 F2). A route of the test's own lets the answer be written just then: its
    view waits for the test, which half-closes and lets it go in one step."""
    monkeypatch.setattr(coalesce, "HOLD_SECONDS", 60.0)  # held, however slow the machine
    app = create_app(settings, clock=clock)
    gate = asyncio.Event()
    waiting = asyncio.Event()

    async def late(request: web.Request) -> web.Response:
        waiting.set()
        await gate.wait()
        return web.Response(text="late")

    app.router.add_get("/test/late", late)
    async with _serve(app, settings) as (port, admin, runner):
        writes = runner._guard.writes
        for _ in range(3):
            gate.clear()
            waiting.clear()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(_request("/test/late", admin.key_id, admin.secret))
                await asyncio.wait_for(waiting.wait(), 10)
                # As after a busy turn: the answer is held. Then the FIN, and the view
                # goes on: the answer is written in the turn that reads the end of input.
                writes.holding = True
                writer.write_eof()
                gate.set()
                status, _, body = await asyncio.wait_for(_answer(reader), 10)
                assert (status, body) == (200, b"late")
            finally:
                writer.close()
