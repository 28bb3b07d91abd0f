"""What the hostile input corpus (tests/api/test_hostile_*.py and
tests/system/test_hostile_server.py) shares: the expected messages, the endpoints a
case is sent to, and raw HTTP/1.1 for what the test client will not send as given."""

import asyncio
import base64
import json
import uuid
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from keysvc.config import MAX_BODY_BYTES
from keysvc.http.auth import MAX_AUTHORIZATION
from keysvc.http.middleware import MAX_LINE_BYTES
from tests.helpers import Client, Creds, assert_error

UUID_RULE = "must be a lowercase UUID such as 123e4567-e89b-42d3-a456-426614174000"
TOO_LARGE = f"request body too large: the limit is {MAX_BODY_BYTES} bytes"
NOT_JSON = "request body must be JSON: send Content-Type: application/json"
TOO_LONG_LINE = f"request line or header too long: each may be at most {MAX_LINE_BYTES} bytes"
AUTH_TOO_LONG = (
    f"invalid credentials: the Authorization header is over {MAX_AUTHORIZATION} characters"
)
SURROGATE = "holds a lone surrogate escape (\\ud800 to \\udfff), which is not a character"
BAD_LIMIT = "limit: must be an integer from 1 to 250"
BAD_CURSOR = "cursor: not a cursor from this list; start again without it"
TEN_MB = 10 * 1024 * 1024


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def org_url(creds: Creds, rest: str = "") -> str:
    return f"/v1/organizations/{creds.organization_id}{rest}"


@dataclass(frozen=True)
class Targets:
    """One URL per endpoint family, with a custom key and role to aim at."""

    admin: Creds
    key_id: str
    role_id: str

    def url(self, endpoint: str) -> str:
        return {
            "list-keys": org_url(self.admin, "/keys"),
            "create-key": org_url(self.admin, "/keys"),
            "get-key": org_url(self.admin, f"/keys/{self.key_id}"),
            "patch-key": org_url(self.admin, f"/keys/{self.key_id}"),
            "list-roles": org_url(self.admin, "/roles"),
            "create-role": org_url(self.admin, "/roles"),
            "patch-role": org_url(self.admin, f"/roles/{self.role_id}"),
            "verify": "/v1/verify",
        }[endpoint]


METHODS = {"create-key": "POST", "patch-key": "PATCH", "create-role": "POST", "patch-role": "PATCH"}
BODY_ENDPOINTS = ["create-key", "patch-key", "create-role", "patch-role"]


async def send(client: Client, targets: Targets, endpoint: str, **kwargs: Any) -> Any:
    method = METHODS.get(endpoint, "GET")
    kwargs["headers"] = {**targets.admin.headers, **kwargs.get("headers", {})}
    return await client.request(method, targets.url(endpoint), **kwargs)


async def expect_error(response: Any, status: int, message: str, where: str) -> None:
    """``assert_error``, saying which endpoint failed (the tests loop over several)."""
    try:
        await assert_error(response, status, message)
    except AssertionError as exc:
        exc.add_note(f"at: {where}")
        raise


# Raw HTTP/1.1, for what the test client will not send as given.


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lowercase names
    body: bytes


# A guard against a hang, not a timing assertion: any answer comes in milliseconds.
ANSWER_WITHIN = 10.0


async def _read_answer(reader: asyncio.StreamReader) -> Answer:
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(status, headers, body)


async def exchange(host: str, port: int, request: bytes) -> Answer:
    """Send ``request`` as it is and read one answer (never waiting for EOF)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(_read_answer(reader), ANSWER_WITHIN)
    finally:
        writer.close()
        with suppress(ConnectionError):
            await writer.wait_closed()


def http(
    method: str, target: str, headers: list[tuple[str, str | bytes]], body: bytes = b""
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    for name, value in headers:
        lines.append(
            name.encode() + b": " + (value if isinstance(value, bytes) else value.encode())
        )
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def raw(client: Client, request: bytes) -> Answer:
    assert client.server.host is not None and client.server.port is not None
    return await exchange(client.server.host, client.server.port, request)


def assert_raw_error(answer: Answer, status: int, message: str | None = None) -> str:
    """The whole envelope of a raw answer; returns its message."""
    assert answer.headers["content-type"].startswith("application/json"), answer
    body = json.loads(answer.body)
    assert answer.status == status, body
    assert set(body) == {"status", "error", "requestId"}, body
    assert body["status"] == status
    assert uuid.UUID(body["requestId"]).version == 4
    assert answer.headers["x-request-id"] == body["requestId"]
    if message is not None:
        assert body["error"] == message
    error: str = body["error"]
    return error


# Past aiohttp's own parser limits and rules: still the envelope.


PARSER_REFUSALS = {
    "header-over-limit": http(
        "GET", "/v1/whoami", [("Authorization", "Basic " + "A" * (MAX_LINE_BYTES + 10))]
    ),
    "other-header-over-limit": http("GET", "/v1/whoami", [("X-Junk", "j" * (MAX_LINE_BYTES * 2))]),
    "url-over-limit": http("GET", "/v1/whoami?x=" + "a" * (MAX_LINE_BYTES + 10), []),
}
