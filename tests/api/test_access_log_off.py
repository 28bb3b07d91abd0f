"""KEYSVC_ACCESS_LOG=off: no access line at all, while an internal error is still
logged, under the request ID its client got, by the middleware's error path."""

import dataclasses
import logging

import pytest

from keysvc.config import Settings
from tests.helpers import (
    ClientFactory,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    exploding_client,
)


async def test_off_logs_no_request_but_still_logs_an_internal_error(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet = dataclasses.replace(settings, access_log="off")
    client = await exploding_client(aiohttp_client, quiet, clock)
    admin = await bootstrap(client.app)
    with caplog.at_level(logging.INFO):
        await assert_ok(await client.get("/v1/whoami", headers=admin.headers))
        verified = await client.get("/v1/verify", headers=admin.headers)
        assert verified.status == 200
        response = await client.get("/v1/explode", headers=admin.headers)
        body = await assert_error(response, 500, "internal server error")
    assert [r for r in caplog.records if r.name == "keysvc.access"] == []
    (logged,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert logged.name == "keysvc" and body["requestId"] in logged.getMessage()
    assert logged.exc_info is not None
