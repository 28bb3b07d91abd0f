"""A connection whose handling by aiohttp ends on an error aiohttp did not expect is
closed, and the error logged without a traceback (``GuardedHandler.start``): such an error
left the connection open, unanswered, past every deadline (rt52 F1 was one, since
answered by keysvc.http.dispatch). Here keysvc serve's own runner, on a real socket, is
given a request factory that fails, standing for any such error."""

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web

from keysvc.config import Settings
from keysvc.http.app import create_app
from keysvc.http.connections import ServiceRunner
from tests.helpers import FakeClock


def _failing(*args: Any) -> web.BaseRequest:
    raise RuntimeError("an error of aiohttp's own")


async def test_a_failed_handling_closes_its_connection(
    settings: Settings, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    runner = ServiceRunner(create_app(settings, clock=clock), settings, handle_signals=False)
    await runner.setup()
    try:
        assert runner.server is not None
        runner.server.request_factory = _failing
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        with caplog.at_level(logging.INFO):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            # Closed at once: well within the header timeout, which would not fire.
            assert await asyncio.wait_for(reader.read(), 3.0) == b""
            writer.close()
        failed = [r for r in caplog.records if "whose handling failed" in r.getMessage()]
        assert [(r.levelno, r.exc_info) for r in failed] == [(logging.ERROR, None)]
        assert "RuntimeError" in failed[0].getMessage()
    finally:
        await runner.cleanup()
