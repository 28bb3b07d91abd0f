"""Structured logs: one JSON line per request with its route template, status,
latency, client and caller; never a secret, a key ID or an Authorization header,
at any level."""

import asyncio
import base64
import io
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from keysvc.credentials import new_key_id, new_secret
from keysvc.http.state import STORE
from keysvc.logs import (
    configure_logging,
)
from tests.helpers import Client, Creds, basic, create_creds
from tests.logs import (
    KEY,
    KEYS,
    access_lines,
    json_lines,
    root_logger_restored,  # noqa: F401 (autouse)
)


@pytest.fixture
def log_stream(caplog: pytest.LogCaptureFixture) -> Iterator[io.StringIO]:
    """Every record of every logger, at DEBUG, as keysvc's JSON lines."""
    caplog.set_level(logging.DEBUG)  # restored by caplog afterwards
    stream = io.StringIO()
    handler = configure_logging("debug", stream)
    yield stream
    logging.getLogger().removeHandler(handler)


async def test_one_json_line_per_request_with_its_fields(
    client: Client,
    admin: Creds,
    log_stream: io.StringIO,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    org = admin.organization_id
    admin_caller = {"id": admin.id, "organizationId": org}
    keys_path = f"/v1/organizations/{org}/keys"
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    dev_caller = {"id": dev.id, "organizationId": org}
    unknown = basic(new_key_id(), new_secret())
    wrong = basic(admin.key_id, new_secret())
    malformed = {"Authorization": "Basic %%not-base64-marker%%"}
    # (response, method, route, status, caller, auth outcome)
    expected: list[tuple[Any, str, str, int, dict[str, str] | None, str | None]] = [
        (None, "POST", KEYS, 200, admin_caller, "ok"),  # the create above
    ]

    async def get(path: str, headers: dict[str, str] | None = None) -> Any:
        response = await client.get(path, headers=headers or {})
        await response.read()
        return response

    expected += [
        (await get(f"{keys_path}/{dev.id}", admin.headers), "GET", KEY, 200, admin_caller, "ok"),
        (await get(f"{keys_path}/{dev.id}", dev.headers), "GET", KEY, 200, dev_caller, "ok"),
        (await get(keys_path, dev.headers), "GET", KEYS, 200, dev_caller, "ok"),
        (await get(f"{keys_path}/{dev.id}", unknown), "GET", KEY, 401, None, "invalid_credentials"),
        (await get(f"{keys_path}/{dev.id}", wrong), "GET", KEY, 401, None, "invalid_credentials"),
        (await get(f"{keys_path}/{dev.id}", malformed), "GET", KEY, 401, None, "malformed"),
        (await get(f"{keys_path}/{dev.id}"), "GET", KEY, 401, None, "malformed"),
        (await get(f"/nowhere/{dev.id}", admin.headers), "GET", "unmatched", 404, None, None),
        (await get("/healthz"), "GET", "/healthz", 200, None, None),
    ]
    put = await client.put(f"{keys_path}/{dev.id}", headers=admin.headers)
    expected.append((put, "PUT", "unmatched", 405, None, None))

    async def broken(*args: object) -> None:
        raise RuntimeError("store is broken")

    def broken_cache(*args: object) -> None:
        raise RuntimeError("store is broken")

    monkeypatch.setattr(client.app[STORE].caches, "cached_key", broken_cache)
    monkeypatch.setattr(client.app[STORE], "get_key", broken)
    failed = await get(f"{keys_path}/{dev.id}", admin.headers)
    expected.append((failed, "GET", KEY, 500, admin_caller, "ok"))

    lines = access_lines(log_stream)
    assert len(lines) == len(expected)
    for line, (response, method, route, status, caller, auth) in zip(lines, expected, strict=True):
        assert line["level"] == "info" and line["message"] == "request"
        if response is not None:
            assert response.status == status
            assert line["requestId"] == response.headers["X-Request-Id"]
        assert (line["method"], line["route"], line["status"]) == (method, route, status)
        assert line.get("caller") == caller
        assert line.get("auth") == auth
        assert line["remote"] == "127.0.0.1"
        assert isinstance(line["latencyMs"], float) and 0 <= line["latencyMs"] < 10_000
    assert len({line["requestId"] for line in lines}) == len(lines)

    # The 500's cause is logged once, as one line, under the request ID the client saw.
    errors = [line for line in json_lines(log_stream) if line["level"] == "error"]
    (error,) = errors
    assert error["logger"] == "keysvc"
    assert failed.headers["X-Request-Id"] in error["message"]
    assert "RuntimeError: store is broken" in error["exception"]

    # Nothing any logger wrote, at any level, carries a credential.
    forbidden = {admin.key_id, admin.secret, dev.key_id, dev.secret}
    for headers in (admin.headers, dev.headers, unknown, wrong, malformed):
        value = headers["Authorization"]
        forbidden |= {value, value.removeprefix("Basic ")}
    forbidden |= {part for header in (unknown, wrong) for part in decoded(header)}
    records = "\n".join(repr(vars(record)) for record in caplog.records)
    assert caplog.records and log_stream.getvalue()
    for text in (log_stream.getvalue(), caplog.text, records):
        for secret in forbidden:
            assert secret not in text


def decoded(headers: dict[str, str]) -> tuple[str, str]:
    """The key ID and secret inside a Basic header."""
    token = headers["Authorization"].removeprefix("Basic ")
    key_id, _, secret = base64.b64decode(token).decode().partition(":")
    return key_id, secret


async def test_a_failed_login_has_no_caller(
    client: Client, admin: Creds, log_stream: io.StringIO
) -> None:
    await client.get(f"/v1/organizations/{admin.organization_id}/keys", headers=basic("a", "b"))
    (line,) = access_lines(log_stream)
    assert line["status"] == 401 and "caller" not in line and line["auth"] == "invalid_credentials"


async def test_a_header_aiohttp_cannot_parse_is_logged_without_its_bytes(
    client: Client, admin: Creds, log_stream: io.StringIO
) -> None:
    """An unparsable request is logged as one short line, none of its bytes in it."""
    token = admin.headers["Authorization"].removeprefix("Basic ")
    bad_lines = [f"Authorization: Basic {token}\x01", f"Authorization : Basic {token}"]
    for bad in bad_lines:
        reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: x\r\n{bad}\r\n\r\n".encode())
        answer = await reader.read()  # until the server closes the connection
        writer.close()
        await writer.wait_closed()
        assert answer.startswith(b"HTTP/1.0 400")
    errors = [line for line in json_lines(log_stream) if line["level"] == "warning"]
    assert [error["message"] for error in errors] == [
        "unparseable request answered 400: it could not be parsed"
    ] * len(bad_lines)
    for error in errors:
        assert "exception" not in error and error["remote"] == "127.0.0.1"
    text = log_stream.getvalue()
    for secret in (token, admin.key_id, admin.secret):
        assert secret not in text
