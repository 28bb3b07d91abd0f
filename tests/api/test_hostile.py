"""The hostile input corpus: every case gets a 4xx envelope naming the problem,
never a 500, a plain-text answer or a hang.

Most cases go through the test client on the real app. What that client cannot
send faithfully (raw bytes in headers, a header twice, framing errors, headers
past aiohttp's parser limits) is written as raw HTTP/1.1 to the same server's
port, or to a real ``keysvc serve``.
"""

import asyncio
import base64
import io
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from keysvc.auth import MAX_AUTHORIZATION
from keysvc.config import MAX_BODY_BYTES
from keysvc.middleware import MAX_LINE_BYTES
from keysvc.state import SETTINGS
from tests.helpers import (
    FAR_FUTURE,
    UNAUTHORIZED,
    Client,
    Creds,
    assert_error,
    assert_ok,
    create,
    create_creds,
)
from tests.server import Server, bootstrap

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


@pytest.fixture
async def targets(client: Client, admin: Creds) -> Targets:
    key = await create(client, admin, {"name": "target", "roles": ["developer"]})
    response = await client.post(
        org_url(admin, "/roles"),
        json={"name": "target", "permissions": ["reports:read"]},
        headers=admin.headers,
    )
    role = await assert_ok(response)
    return Targets(admin, key["key"]["id"], role["id"])


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


# The Authorization header.

MALFORMED_AUTHORIZATION = {
    "empty": "",
    "scheme-only": "Basic",
    "scheme-and-space": "Basic ",
    "no-colon": f"Basic {b64(b'no-colon-here')}",
    "colon-only": f"Basic {b64(b':')}",
    "empty-key-id": f"Basic {b64(b':secret')}",
    "empty-secret": f"Basic {b64(b'key-id:')}",
    "bad-base64": "Basic !!!not-base64!!!",
    "base64-unpadded": "Basic YTpi",  # "a:b" is YTpi: valid, but an unknown key
    "base64-truncated": "Basic YTpiY",
    "base64-of-non-utf8": f"Basic {b64(bytes([0xFF, 0xFE, 0x3A, 0x41]))}",
    "base64-of-nul": "Basic " + b64(b"id\x00:secret"),
    "basic-twice-in-one-header": f"Basic {b64(b'a:b')} Basic {b64(b'a:b')}",
    "bearer": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.signature",
    "digest": 'Digest username="a", realm="keysvc", nonce="x", uri="/", response="y"',
    "token-without-scheme": b64(b"a:b"),
    "sql-looking": "Basic ' OR '1'='1",
    "checksum-secret-wrong": f"Basic {b64(b'abc:keysvc_' + b'A' * 42)}",
    f"at-the-limit-{MAX_AUTHORIZATION}": "Basic " + "A" * (MAX_AUTHORIZATION - 6),
}
AUTH_ENDPOINTS = ["list-keys", "create-key", "patch-key", "list-roles", "verify"]


@pytest.mark.parametrize(
    "header", MALFORMED_AUTHORIZATION.values(), ids=MALFORMED_AUTHORIZATION.keys()
)
async def test_malformed_authorization_is_one_401(
    client: Client, targets: Targets, header: str
) -> None:
    """Malformed credentials get the one credentials message, on every endpoint."""
    for endpoint in AUTH_ENDPOINTS:
        response = await send(
            client, targets, endpoint, headers={"Authorization": header}, json={"name": "x"}
        )
        await expect_error(response, 401, UNAUTHORIZED, endpoint)
        assert response.headers["WWW-Authenticate"] == 'Basic realm="keysvc"'


async def test_lowercase_scheme_is_still_basic(client: Client, targets: Targets) -> None:
    """Schemes are case-insensitive (RFC 9110): "basic" is Basic, not garbage."""
    token = targets.admin.headers["Authorization"].removeprefix("Basic ")
    response = await send(client, targets, "list-keys", headers={"Authorization": f"basic {token}"})
    await assert_ok(response)


async def test_authorization_over_the_limit_says_so(client: Client, targets: Targets) -> None:
    header = "Basic " + "A" * (MAX_AUTHORIZATION - 5)  # one character over
    for endpoint in AUTH_ENDPOINTS:
        response = await send(client, targets, endpoint, headers={"Authorization": header})
        await expect_error(response, 401, AUTH_TOO_LONG, endpoint)
        assert response.headers["WWW-Authenticate"] == 'Basic realm="keysvc"'


async def test_over_long_authorization_counts_as_a_failed_login(
    client: Client, targets: Targets
) -> None:
    header = {"Authorization": "Basic " + "A" * 9000}
    for _ in range(client.app[SETTINGS].auth_failures):  # failed logins an address may make
        await assert_error(
            await send(client, targets, "list-keys", headers=header), 401, AUTH_TOO_LONG
        )
    response = await send(client, targets, "list-keys")  # even with good credentials now
    assert response.status == 429
    assert (await response.json())["error"].startswith("too many failed authentications")


RAW_AUTHORIZATION = {
    "8KiB": [("Authorization", "Basic " + "A" * 8192)],
    "8KiB-valid-base64": [("Authorization", "Basic " + b64(b"k:" + b"s" * 6200))],
    "non-utf8-bytes": [("Authorization", b"Basic \xff\xfe\xfd")],
    "latin1-after-token": [("Authorization", b"Basic YTpi\xe9")],
    "nul-byte-in-base64": [("Authorization", b"Basic YT\x00pi")],
}
RAW_AUTH_EXPECTED = {
    "8KiB": AUTH_TOO_LONG,
    "8KiB-valid-base64": AUTH_TOO_LONG,
    "non-utf8-bytes": UNAUTHORIZED,
    "latin1-after-token": UNAUTHORIZED,
    "nul-byte-in-base64": None,  # aiohttp's parser refuses NUL in a header: a 400
}


@pytest.mark.parametrize("case", RAW_AUTHORIZATION)
async def test_raw_authorization_headers(client: Client, targets: Targets, case: str) -> None:
    request = http("GET", targets.url("list-keys"), RAW_AUTHORIZATION[case])
    answer = await raw(client, request)
    expected = RAW_AUTH_EXPECTED[case]
    if expected is None:
        assert assert_raw_error(answer, 400).startswith("malformed HTTP request: ")
    else:
        assert_raw_error(answer, 401, expected)
        assert answer.headers["www-authenticate"] == 'Basic realm="keysvc"'


@pytest.mark.parametrize("second", ["same", "other-valid", "garbage"])
async def test_two_authorization_headers_are_refused(
    client: Client, targets: Targets, second: str
) -> None:
    """Two Authorization headers are ambiguous (a proxy may pass on either one):
    refused, even when the first alone would be accepted."""
    good = targets.admin.headers["Authorization"]
    other = await create_creds(client, targets.admin, {"name": "other", "roles": ["admin"]})
    second_header = {
        "same": good,
        "other-valid": other.headers["Authorization"],
        "garbage": "Bearer x",
    }[second]
    for endpoint in ("list-keys", "verify"):
        request = http(
            "GET",
            targets.url(endpoint),
            [("Authorization", good), ("Authorization", second_header)],
        )
        answer = await raw(client, request)
        assert_raw_error(answer, 401, "invalid credentials: send one Authorization header, not 2")


# Past aiohttp's own parser limits and rules: still the envelope.


PARSER_REFUSALS = {
    "header-over-limit": http(
        "GET", "/v1/whoami", [("Authorization", "Basic " + "A" * (MAX_LINE_BYTES + 10))]
    ),
    "other-header-over-limit": http("GET", "/v1/whoami", [("X-Junk", "j" * (MAX_LINE_BYTES * 2))]),
    "url-over-limit": http("GET", "/v1/whoami?x=" + "a" * (MAX_LINE_BYTES + 10), []),
}
PARSER_MALFORMED = {
    "content-length-not-a-number": http(
        "POST", "/v1/whoami", [("Content-Length", "abc"), ("Content-Type", "application/json")]
    ),
    "content-length-negative": http("POST", "/v1/whoami", [("Content-Length", "-1")]),
    "content-length-twice-differing": http(
        "POST", "/v1/whoami", [("Content-Length", "1"), ("Content-Length", "2")], b"{}"
    ),
    "chunked-and-content-length": http(
        "POST",
        "/v1/whoami",
        [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
        b"0\r\n\r\n",
    ),
    "too-many-headers": http("GET", "/v1/whoami", [(f"X-H{n}", "v") for n in range(200)]),
    "control-character-in-header": http("GET", "/v1/whoami", [("X-Junk", b"a\x01b")]),
    "space-before-colon": b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nX-Junk : v\r\n\r\n",
    "not-http": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
    "bad-http-version": b"GET /v1/whoami HTTP/7.3\r\nHost: x\r\n\r\n",
}


@pytest.mark.parametrize("case", PARSER_REFUSALS)
async def test_over_parser_limits_is_an_envelope(client: Client, case: str) -> None:
    assert_raw_error(await raw(client, PARSER_REFUSALS[case]), 400, TOO_LONG_LINE)


@pytest.mark.parametrize("case", PARSER_MALFORMED)
async def test_unparseable_requests_are_envelopes(client: Client, case: str) -> None:
    message = assert_raw_error(await raw(client, PARSER_MALFORMED[case]), 400)
    # The parser's reason, but none of the request's bytes echoed back.
    assert message.startswith("malformed HTTP request: ")
    assert "\n" not in message and "b'" not in message


def test_real_server_answers_long_headers_in_the_envelope(tmp_path: Path) -> None:
    """Through `keysvc serve` itself: the raised parser limits and the envelope
    for what is past them are the server's, not only the test client's."""

    async def probe(port: int) -> None:
        eight_kib = http("GET", "/v1/whoami", [("Authorization", "Basic " + "A" * 8192)])
        assert_raw_error(await exchange("127.0.0.1", port, eight_kib), 401, AUTH_TOO_LONG)
        answer = await exchange("127.0.0.1", port, PARSER_REFUSALS["header-over-limit"])
        assert_raw_error(answer, 400, TOO_LONG_LINE)
        answer = await exchange("127.0.0.1", port, PARSER_REFUSALS["url-over-limit"])
        assert_raw_error(answer, 400, TOO_LONG_LINE)

    db = tmp_path / "keysvc.db"
    bootstrap(db)
    with Server(db) as server:
        asyncio.run(probe(server.port))
        assert server.proc.poll() is None


# The JSON body.

BAD_BODIES: dict[str, tuple[bytes, int, str]] = {
    "invalid-utf8": (b'{"name": "\xff"}', 400, "body: is not valid UTF-8"),
    "latin1-text": ('{"name": "caf\u00e9"}'.encode("latin-1"), 400, "body: is not valid UTF-8"),
    "utf8-bom": (
        b'\xef\xbb\xbf{"name": "k"}',
        400,
        "body: invalid JSON at line 1 column 1: Unexpected UTF-8 BOM (decode using utf-8-sig)",
    ),
    "duplicate-keys": (
        b'{"name": "a", "name": "b"}',
        400,
        "body: field 'name' appears more than once",
    ),
    "duplicate-nested-keys": (
        b'{"x": {"y": 1, "y": 2}}',
        400,
        "body: field 'y' appears more than once",
    ),
    "deep-arrays-1000": (b"[" * 1000 + b"]" * 1000, 400, "body: JSON is nested too deeply"),
    "deep-objects-1000": (
        b'{"a":' * 1000 + b"1" + b"}" * 1000,
        400,
        "body: JSON is nested too deeply",
    ),
    "nan": (b'{"name": NaN}', 400, "body: invalid JSON: NaN is not valid JSON"),
    "infinity": (b'{"name": Infinity}', 400, "body: invalid JSON: Infinity is not valid JSON"),
    "minus-infinity": (
        b'{"name": -Infinity}',
        400,
        "body: invalid JSON: -Infinity is not valid JSON",
    ),
    "float-overflow": (
        b'{"name": 1e400}',
        400,
        "body: invalid JSON: the number 1e400 is out of range",
    ),
    "negative-float-overflow": (
        b'{"name": -1.5e999}',
        400,
        "body: invalid JSON: the number -1.5e999 is out of range",
    ),
    "integer-101-digits": (
        b'{"name": ' + b"9" * 101 + b"}",
        400,
        "body: invalid JSON: a number has more than 100 digits",
    ),
    "integer-5000-digits": (
        b'{"name": ' + b"9" * 5000 + b"}",
        400,
        "body: invalid JSON: a number has more than 100 digits",
    ),
    "top-level-array": (b'[{"name": "k"}]', 400, "body: must be a JSON object"),
    "top-level-string": (b'"name"', 400, "body: must be a JSON object"),
    "top-level-number": (b"42", 400, "body: must be a JSON object"),
    "top-level-null": (b"null", 400, "body: must be a JSON object"),
    "top-level-true": (b"true", 400, "body: must be a JSON object"),
    "empty": (b"", 400, "body: is required; send a JSON object"),
    "whitespace-only": (b" \r\n\t ", 400, "body: is required; send a JSON object"),
    "trailing-garbage": (
        b'{"name": "k"} {}',
        400,
        "body: invalid JSON at line 1 column 15: Extra data",
    ),
    "single-quotes": (
        b"{'name': 'k'}",
        400,
        "body: invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes",
    ),
    "lone-high-surrogate": (b'{"name": "\\ud800"}', 400, f"name: {SURROGATE}"),
    "lone-low-surrogate": (b'{"name": "a\\udfffb"}', 400, f"name: {SURROGATE}"),
    "reversed-surrogate-pair": (b'{"name": "\\udd11\\ud83d"}', 400, f"name: {SURROGATE}"),
    "surrogate-in-field-name": (b'{"\\ud800": 1}', 400, f"body: a field name {SURROGATE}"),
}


@pytest.mark.parametrize("case", BAD_BODIES)
async def test_bad_json_body(client: Client, targets: Targets, case: str) -> None:
    raw_body, status, message = BAD_BODIES[case]
    for endpoint in BODY_ENDPOINTS:
        response = await send(
            client, targets, endpoint, data=raw_body, headers={"Content-Type": "application/json"}
        )
        await expect_error(response, status, message, endpoint)


CONTENT_TYPES = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/jsonx",
    "application/json-patch+json",
    "text/json",
    "",
]


@pytest.mark.parametrize("content_type", CONTENT_TYPES, ids=lambda t: t or "empty")
async def test_wrong_content_type_is_415(
    client: Client, targets: Targets, content_type: str
) -> None:
    for endpoint in BODY_ENDPOINTS:
        headers = {"Content-Type": content_type}
        response = await send(client, targets, endpoint, data=b'{"name": "k"}', headers=headers)
        await expect_error(response, 415, NOT_JSON, endpoint)


@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
async def test_missing_body_is_400(
    client: Client, targets: Targets, content_type: str | None
) -> None:
    """No body at all (Content-Length 0, or none), whatever the Content-Type, or none:
    the body is what is missing (a body of the wrong type is a 415, above)."""
    typed = [] if content_type is None else [("Content-Type", content_type)]
    for endpoint in BODY_ENDPOINTS:
        for length in ([("Content-Length", "0")], []):
            request = http(
                METHODS[endpoint],
                targets.url(endpoint),
                [
                    ("Authorization", targets.admin.headers["Authorization"]),
                    *typed,
                    *length,
                ],
            )
            answer = await raw(client, request)
            assert_raw_error(answer, 400, "body: is required; send a JSON object")


@pytest.mark.parametrize("endpoint", ["create-key", "patch-role"])
async def test_ten_megabyte_body_is_413(client: Client, targets: Targets, endpoint: str) -> None:
    body = io.BytesIO(b'{"name": "' + b"x" * TEN_MB + b'"}')  # with its Content-Length
    response = await send(
        client, targets, endpoint, data=body, headers={"Content-Type": "application/json"}
    )
    await assert_error(response, 413, TOO_LARGE)
    assert response.headers["Connection"] == "close"  # the rest of the body is never read


async def _chunks(total: int, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    yield b'{"name": "'
    for _ in range(total // size):
        yield b"x" * size
    yield b'"}'


async def test_ten_megabyte_chunked_body_is_413(client: Client, targets: Targets) -> None:
    """Without a Content-Length, the limit is applied while reading."""
    response = await send(
        client,
        targets,
        "create-key",
        data=_chunks(TEN_MB),
        headers={"Content-Type": "application/json"},
    )
    await assert_error(response, 413, TOO_LARGE)


async def test_body_at_the_limit_is_read(client: Client, targets: Targets) -> None:
    """Exactly the limit is allowed: the 413 is for bigger bodies only."""
    padding = MAX_BODY_BYTES - len(b'{"name": "k", "roles": ["developer"]}')
    body = b'{"name": "k", "roles": ["developer"]' + b" " * padding + b"}"
    assert len(body) == MAX_BODY_BYTES
    response = await send(
        client, targets, "create-key", data=body, headers={"Content-Type": "application/json"}
    )
    await assert_ok(response)


@pytest.mark.parametrize("length", [MAX_BODY_BYTES + 1, TEN_MB, 10**15])
async def test_huge_content_length_without_a_body_is_413_at_once(
    client: Client, targets: Targets, length: int
) -> None:
    """The body is announced and never sent: the answer comes without waiting for it."""
    for endpoint in BODY_ENDPOINTS:
        request = http(
            METHODS[endpoint],
            targets.url(endpoint),
            [
                ("Authorization", targets.admin.headers["Authorization"]),
                ("Content-Type", "application/json"),
                ("Content-Length", str(length)),
            ],
        )
        answer = await raw(client, request)  # fails on a hang: ANSWER_WITHIN
        assert_raw_error(answer, 413, TOO_LARGE)


BROKEN_PAYLOADS = {
    "bad-chunk-size": (
        [("Transfer-Encoding", "chunked")],
        b"zz\r\n{}\r\n0\r\n\r\n",
        "malformed HTTP request: ",
    ),
    "gzip-that-is-not": (
        [("Content-Encoding", "gzip"), ("Content-Length", "13")],
        b'{"name": "k"}',
        "body: could not be read: ",
    ),
    "deflate-that-is-not": (
        [("Content-Encoding", "deflate"), ("Content-Length", "13")],
        b'{"name": "k"}',
        "body: could not be read: ",
    ),
}


@pytest.mark.parametrize("case", BROKEN_PAYLOADS)
async def test_broken_body_framing_is_400(client: Client, targets: Targets, case: str) -> None:
    extra, payload, prefix = BROKEN_PAYLOADS[case]
    request = http(
        "POST",
        targets.url("create-key"),
        [
            ("Authorization", targets.admin.headers["Authorization"]),
            ("Content-Type", "application/json"),
            *extra,
        ],
        payload,
    )
    assert assert_raw_error(await raw(client, request), 400).startswith(prefix)


# Path parameters and the query string.

PATH_ENDPOINTS = {
    "list-keys": ("GET", "/v1/organizations/{org}/keys"),
    "create-key": ("POST", "/v1/organizations/{org}/keys"),
    "get-key": ("GET", "/v1/organizations/{org}/keys/{id}"),
    "patch-key": ("PATCH", "/v1/organizations/{org}/keys/{id}"),
    "delete-key": ("DELETE", "/v1/organizations/{org}/keys/{id}"),
    "list-roles": ("GET", "/v1/organizations/{org}/roles"),
    "create-role": ("POST", "/v1/organizations/{org}/roles"),
    "get-role": ("GET", "/v1/organizations/{org}/roles/{id}"),
    "patch-role": ("PATCH", "/v1/organizations/{org}/roles/{id}"),
    "delete-role": ("DELETE", "/v1/organizations/{org}/roles/{id}"),
}
BAD_UUIDS = {
    "not-a-uuid": "not-a-uuid",
    "uppercase": "0B5D3C8E-6C1A-4C59-9D8A-7A1F0E000001",
    "sql": "1' or '1'='1",
    "sql-comment": "x;--drop table api_keys",
    "no-hyphens": "0b5d3c8e6c1a4c599d8a7a1f0e000001",
    "urn": "urn:uuid:0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001",
    "trailing-space": "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001 ",
    "nul": "%00",
    "fullwidth-digits": "\uff10b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001",
}


@pytest.mark.parametrize("value", BAD_UUIDS.values(), ids=BAD_UUIDS.keys())
async def test_bad_path_uuid_is_400(client: Client, targets: Targets, value: str) -> None:
    """Every path UUID of every endpoint, checked before anything else is done."""
    for endpoint, (method, template) in PATH_ENDPOINTS.items():
        target_id = targets.role_id if "/roles/" in template else targets.key_id
        id_name = "roleId" if "/roles/" in template else "keyId"
        urls = {"organizationId": template.format(org=value, id=target_id)}
        if "{id}" in template:
            urls[id_name] = template.format(org=targets.admin.organization_id, id=value)
        for name, url in urls.items():
            response = await client.request(method, url, json={}, headers=targets.admin.headers)
            await expect_error(response, 400, f"{name}: {UUID_RULE}", f"{endpoint} {name}")


async def test_braces_in_path_match_no_route(client: Client, targets: Targets) -> None:
    """The router takes no braces in a path segment: a 404 envelope, not a 400."""
    braced = "{" + targets.key_id + "}"
    for url in (f"/v1/organizations/{braced}/keys", org_url(targets.admin, f"/keys/{braced}")):
        response = await client.get(url, headers=targets.admin.headers)
        await assert_error(response, 404, "not found: no such endpoint")


BAD_LIMITS = {
    "zero": "0",
    "minus-one": "-1",
    "ten-to-the-12": str(10**12),
    "251": "251",
    "empty": "",
    "word": "ten",
    "float": "1.0",
    "exponent": "1e2",
    "hex": "0x10",
    "underscore": "5_0",
    "plus": "+5",
    "space": " 5",
    "arabic-indic-digit": "\u0665",
    "circled-digit": "\u2460",
    "nan": "NaN",
    "5000-digits": "9" * 5000,
    "sql": "1; drop table api_keys",
}


@pytest.mark.parametrize("limit", BAD_LIMITS.values(), ids=BAD_LIMITS.keys())
async def test_bad_limit_is_400(client: Client, admin: Creds, limit: str) -> None:
    response = await client.get(
        org_url(admin, "/keys"), params={"limit": limit}, headers=admin.headers
    )
    await assert_error(response, 400, BAD_LIMIT)


@pytest.mark.parametrize("limit", ["1", "250", "007"])
async def test_limit_bounds_are_accepted(client: Client, admin: Creds, limit: str) -> None:
    response = await client.get(
        org_url(admin, "/keys"), params={"limit": limit}, headers=admin.headers
    )
    assert len(await assert_ok(response)) == 1


async def test_query_parameter_twice_or_unknown(client: Client, admin: Creds) -> None:
    twice = await client.get(org_url(admin, "/keys?limit=1&limit=2"), headers=admin.headers)
    await assert_error(twice, 400, "limit: given more than once")
    unknown = await client.get(org_url(admin, "/keys?limit=1&id=1"), headers=admin.headers)
    await assert_error(unknown, 400, "id: is not a known field")


BAD_CURSORS = {
    "empty": "",
    "word": "garbage",
    "sql": "1' or '1'='1",
    "no-signature": "1.",
    "no-position": ".abc",
    "superscript-digit": "\u00b2.abc",
    "arabic-indic-digit": "\u0663.abc",
    "negative": "-1.abc",
    "19-digits": "9" * 19 + ".abc",
    "extra-dot": "1.abc.def",
    "forged-signature": "1.AAAAAAAAAAAAAAAAAAAAAA",
    "nul": "1.\x00",
    "huge": "1." + "A" * 10_000,
}


@pytest.mark.parametrize("cursor", BAD_CURSORS.values(), ids=BAD_CURSORS.keys())
async def test_bad_cursor_is_400(client: Client, admin: Creds, cursor: str) -> None:
    response = await client.get(
        org_url(admin, "/keys"), params={"cursor": cursor}, headers=admin.headers
    )
    await assert_error(response, 400, BAD_CURSOR)


async def test_non_utf8_query_is_400(client: Client, admin: Creds) -> None:
    for query in ("cursor=%FF%FE", "limit=%FF", "%FF=1"):
        request = http(
            "GET",
            org_url(admin, f"/keys?{query}"),
            [("Authorization", admin.headers["Authorization"])],
        )
        assert_raw_error(await raw(client, request), 400)


async def test_foreign_cursor_is_400(client: Client, admin: Creds, other_admin: Creds) -> None:
    await create(client, other_admin, {"name": "second", "roles": ["developer"]})
    page = await client.get(
        org_url(other_admin, "/keys"), params={"limit": "1"}, headers=other_admin.headers
    )
    cursor = (await page.json())["nextCursor"]
    assert cursor
    response = await client.get(
        org_url(admin, "/keys"), params={"cursor": cursor}, headers=admin.headers
    )
    await assert_error(response, 400, BAD_CURSOR)


BAD_PERMISSIONS = {
    "uppercase": "REPORTS:READ",
    "sql": "' or 1=1 --",
    "no-action": "reports",
    "too-long": "a:" + "b" * 300,
    "spaces": "reports: read",
    "unicode": "r\u00e9ports:read",
    "wildcard-only-namespace": "*:read",
}


@pytest.mark.parametrize("permission", BAD_PERMISSIONS.values(), ids=BAD_PERMISSIONS.keys())
async def test_verify_bad_permission_is_400(client: Client, admin: Creds, permission: str) -> None:
    message = "permission: must be namespace:action, such as reports:read"
    in_header = {**admin.headers, "X-Required-Permission": permission}
    response = await client.get("/v1/verify", headers=in_header)
    await expect_error(response, 400, message, "X-Required-Permission")
    in_query = {"permission": permission}
    response = await client.get("/v1/verify", params=in_query, headers=admin.headers)
    await expect_error(response, 400, message, "?permission=")


async def test_verify_non_utf8_permission_header_is_400(client: Client, admin: Creds) -> None:
    request = http(
        "GET",
        "/v1/verify",
        [
            ("Authorization", admin.headers["Authorization"]),
            ("X-Required-Permission", b"reports:r\xe9ad"),
        ],
    )
    assert_raw_error(
        await raw(client, request),
        400,
        "permission: must be namespace:action, such as reports:read",
    )


async def test_garbage_forwarded_for_is_ignored_not_a_500(client: Client, admin: Creds) -> None:
    """X-Forwarded-For from an untrusted peer is never read: garbage there changes nothing."""
    request = http(
        "GET",
        "/v1/whoami",
        [
            ("Authorization", admin.headers["Authorization"]),
            ("X-Forwarded-For", b"\xff, fe80::1%eth0, 1' or '1'='1, " + b"9" * 5000),
        ],
    )
    answer = await raw(client, request)
    assert answer.status == 200
    assert json.loads(answer.body)["result"]["id"] == admin.id


# Fields.

GOOD_NAMES = {
    "rtl-hebrew": "\u05de\u05e4\u05ea\u05d7 \u05e8\u05d0\u05e9\u05d9",
    "rtl-arabic": "\u0645\u0641\u062a\u0627\u062d \u0627\u0644\u0625\u0646\u062a\u0627\u062c",
    "emoji": "\U0001f511 deploy \U0001f680",
    "combining-marks": "Z\u0351\u036b\u0343a\u0310\u0301l\u0357g\u030fo",
    "cjk": "\u672c\u756a\u74b0\u5883\u306e\u30ad\u30fc",
    "255-emoji": "\U0001f511" * 255,
    "sql-looking": "'; drop table api_keys; --",
    "html": "<script>alert(1)</script>",
}


@pytest.mark.parametrize("name", GOOD_NAMES.values(), ids=GOOD_NAMES.keys())
async def test_unicode_names_are_stored_exactly(
    client: Client, targets: Targets, name: str
) -> None:
    """Names are text, whatever the script: stored and read back code point for code point."""
    admin = targets.admin
    created = (await create(client, admin, {"name": name, "roles": ["developer"]}))["key"]
    assert created["name"] == name
    got = await assert_ok(
        await client.get(org_url(admin, f"/keys/{created['id']}"), headers=admin.headers)
    )
    assert got["name"] == name
    listed = await assert_ok(await client.get(org_url(admin, "/keys"), headers=admin.headers))
    assert name in [key["name"] for key in listed]
    patched = await send(client, targets, "patch-key", json={"name": name})
    assert (await assert_ok(patched))["name"] == name
    role = await send(client, targets, "create-role", json={"name": name})
    assert (await assert_ok(role))["name"] == name
    renamed = await send(client, targets, "patch-role", json={"name": "x" + name[1:]})
    assert (await assert_ok(renamed))["name"] == "x" + name[1:]


INVISIBLE = "name: must not contain invisible or formatting characters such as"
BAD_NAMES = {
    "nul": ("\x00", "name: must not contain control characters"),
    "nul-inside": ("a\x00b", "name: must not contain control characters"),
    "escape": ("a\x1b[31mred", "name: must not contain control characters"),
    "delete": ("a\x7fb", "name: must not contain control characters"),
    "c1-control": ("a\x9bb", "name: must not contain control characters"),
    "newline": ("a\nb", "name: must not contain control characters"),
    "bidi-override": ("invoice\u202egpj.exe", f"{INVISIBLE} U+202E"),
    "zwj-sequence": ("\U0001f469\u200d\U0001f4bb on-call", f"{INVISIBLE} U+200D"),
    "only-whitespace": ("\u3000 \t", "name: must be 1 to 255 characters"),
    "256-emoji": ("\U0001f511" * 256, "name: must be 1 to 255 characters"),
    "lone-surrogate": ("\ud800", f"name: {SURROGATE}"),
    "number": (7, "name: must be a string"),
    "array": (["a"], "name: must be a string"),
    "object": ({"a": 1}, "name: must be a string"),
    "null": (None, "name: must not be null"),
}


@pytest.mark.parametrize("case", BAD_NAMES)
async def test_bad_names_are_400(client: Client, targets: Targets, case: str) -> None:
    name, message = BAD_NAMES[case]
    for endpoint in BODY_ENDPOINTS:
        body: dict[str, Any] = {"name": name}
        if endpoint == "create-key":
            body["roles"] = ["developer"]
        response = await send(client, targets, endpoint, json=body)
        await expect_error(response, 400, message, endpoint)


def _ip_list(count: int) -> list[dict[str, str]]:
    return [{"source": f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"} for n in range(count)]


KEY_BODY_ENDPOINTS = ["create-key", "patch-key"]


def key_body(endpoint: str, **fields: Any) -> dict[str, Any]:
    base = {"name": "k", "roles": ["developer"]} if endpoint == "create-key" else {}
    return {**base, **fields}


@pytest.mark.parametrize("endpoint", KEY_BODY_ENDPOINTS)
async def test_ten_thousand_ip_entries(client: Client, targets: Targets, endpoint: str) -> None:
    """10,000 real entries do not fit in a body; 10,000 tiny ones do, and are refused
    by the list limit in one message, not ten thousand."""
    big = await send(
        client, targets, endpoint, json=key_body(endpoint, ipAccessList=_ip_list(10_000))
    )
    await assert_error(big, 413, TOO_LARGE)
    tiny = json.dumps(key_body(endpoint, ipAccessList=[{}] * 10_000)).encode()
    assert len(tiny) < MAX_BODY_BYTES
    response = await send(
        client, targets, endpoint, data=tiny, headers={"Content-Type": "application/json"}
    )
    await assert_error(response, 400, "ipAccessList: must have at most 100 entries")


@pytest.mark.parametrize("endpoint", KEY_BODY_ENDPOINTS)
async def test_ip_list_limit_boundary(client: Client, targets: Targets, endpoint: str) -> None:
    over = await send(
        client, targets, endpoint, json=key_body(endpoint, ipAccessList=_ip_list(101))
    )
    await assert_error(over, 400, "ipAccessList: must have at most 100 entries")
    at = await send(client, targets, endpoint, json=key_body(endpoint, ipAccessList=_ip_list(100)))
    result = await assert_ok(at)
    stored = result["key"] if endpoint == "create-key" else result
    assert stored["ipAccessList"] == _ip_list(100)


LONG_LISTS = {
    "assignedRoleIds": (
        "create-key",
        {"name": "k", "assignedRoleIds": ["x"] * 10_000},
        "assignedRoleIds: must have at most 100 entries",
    ),
    "role-permissions": (
        "create-role",
        {"name": "r", "permissions": [1] * 10_000},
        "permissions: must have at most 100 entries",
    ),
    "role-policies": (
        "create-role",
        {"name": "r", "policies": [1] * 10_000},
        "policies: must have at most 100 entries",
    ),
    "role-actors": (
        "patch-role",
        {"actors": [1] * 10_000},
        "actors: must have at most 1000 entries",
    ),
}


@pytest.mark.parametrize("case", LONG_LISTS)
async def test_long_lists_get_one_message(client: Client, targets: Targets, case: str) -> None:
    endpoint, body, message = LONG_LISTS[case]
    response = await send(client, targets, endpoint, json=body)
    await assert_error(response, 400, message)


async def test_many_bad_entries_get_a_bounded_answer(client: Client, targets: Targets) -> None:
    """Under every list limit, still many errors: the answer lists ten, in order."""
    sources = [{"source": "bad"}] * 100
    response = await send(
        client, targets, "create-key", json=key_body("create-key", ipAccessList=sources)
    )
    one = "must be an IPv4 or IPv6 address or CIDR"
    listed = "; ".join(f"ipAccessList.{n}.source: {one}" for n in range(10))
    await assert_error(response, 400, f"{listed}; and 90 more")


async def test_lone_surrogate_deep_in_the_body_is_named(client: Client, targets: Targets) -> None:
    """Caught wherever it is (it would otherwise be stored, or fail the insert)."""
    entry = b'{"source": "10.0.0.0/8", "description": "office \\udc00"}'
    for endpoint in KEY_BODY_ENDPOINTS:
        body = b'{"name": "k", "roles": ["developer"], "ipAccessList": [' + entry + b"]}"
        response = await send(
            client, targets, endpoint, data=body, headers={"Content-Type": "application/json"}
        )
        message = f"ipAccessList.0.description: {SURROGATE}"
        await expect_error(response, 400, message, endpoint)


ZONE_IDS = ["fe80::1%eth0", "fe80::1%1", "fe80::%25eth0/64", "fe80::1%", "::1%lo/128"]


@pytest.mark.parametrize("source", ZONE_IDS)
async def test_ipv6_zone_ids_are_refused(client: Client, targets: Targets, source: str) -> None:
    for endpoint in KEY_BODY_ENDPOINTS:
        body = key_body(endpoint, ipAccessList=[{"source": source}])
        response = await send(client, targets, endpoint, json=body)
        message = "ipAccessList.0.source: must not carry an IPv6 zone ID"
        await expect_error(response, 400, message, endpoint)


BAD_EXPIRE_AT = {
    "year-0001": ("0001-01-01T00:00:00Z", "expireAt: must be in the future"),
    "year-0001-with-offset": ("0001-01-01T00:00:00+01:00", "expireAt: is out of range"),
    "year-9999-behind-utc": ("9999-12-31T23:59:59-01:00", "expireAt: is out of range"),
    "year-10000": (
        "10000-01-01T00:00:00Z",
        "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z",
    ),
    "no-timezone": (
        "2099-01-01T00:00:00",
        "expireAt: must include a time zone offset, such as Z or +02:00",
    ),
    "date-only": ("2099-01-01", "expireAt: must include a time zone offset, such as Z or +02:00"),
    "offset-24h": (
        "2099-01-01T00:00:00+24:00",
        "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z",
    ),
    "month-13": (
        "2099-13-01T00:00:00Z",
        "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z",
    ),
    "epoch-number": (4102444800, "expireAt: must be an ISO-8601 date-time string, null or empty"),
    "sql": (
        "2099-01-01' or '1'='1",
        "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z",
    ),
}


@pytest.mark.parametrize("case", BAD_EXPIRE_AT)
async def test_bad_expire_at_is_400(client: Client, targets: Targets, case: str) -> None:
    value, message = BAD_EXPIRE_AT[case]
    for endpoint in KEY_BODY_ENDPOINTS:
        response = await send(client, targets, endpoint, json=key_body(endpoint, expireAt=value))
        await expect_error(response, 400, message, endpoint)


@pytest.mark.parametrize(
    ("sent", "answered"),
    [
        ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59Z"),
        ("9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59.999999Z"),
        ("9999-12-31T23:59:59+00:00", "9999-12-31T23:59:59Z"),
        ("9999-12-31T22:00:00-01:00", "9999-12-31T23:00:00Z"),
    ],
)
async def test_year_9999_is_stored_read_and_compared(
    client: Client, targets: Targets, sent: str, answered: str
) -> None:
    """The latest expiry there is: no overflow when it is stored, read, listed,
    compared at authentication, or changed."""
    admin = targets.admin
    body = {"name": "far", "roles": ["admin"], "expireAt": sent}
    far = await create_creds(client, admin, body)
    got = await assert_ok(
        await client.get(org_url(admin, f"/keys/{far.id}"), headers=admin.headers)
    )
    assert got["expireAt"] == answered
    listed = await assert_ok(await client.get(org_url(admin, "/keys"), headers=far.headers))
    assert answered in [key["expireAt"] for key in listed]
    response = await client.get("/v1/verify", headers=far.headers)
    assert response.status == 200
    patched = await client.patch(
        org_url(admin, f"/keys/{far.id}"), json={"name": "far 2"}, headers=far.headers
    )
    assert (await assert_ok(patched))["expireAt"] == answered
    moved = await client.patch(
        org_url(admin, f"/keys/{far.id}"), json={"expireAt": FAR_FUTURE}, headers=admin.headers
    )
    assert (await assert_ok(moved))["expireAt"] == FAR_FUTURE


async def test_field_and_parameter_names_of_thousands_of_digits(
    client: Client, admin: Creds
) -> None:
    """Error messages are sorted by their numbers without int(): no 500 past Python's
    4,300-digit conversion limit; and a client's field name is quoted cut short."""
    digits = "1" * 5000
    keys = f"/v1/organizations/{admin.organization_id}/keys"
    response = await client.get(f"{keys}?{digits}=1", headers=admin.headers)
    assert response.status == 400
    response = await client.post(
        keys,
        data=f'{{"name": "a", "{digits}": 1}}',
        headers={**admin.headers, "Content-Type": "application/json"},
    )
    body = await assert_error(response, 400, f"{digits[:64]}: is not a known field")
    assert digits[:65] not in body["error"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization : Basic c2VjcmV0OnNlY3JldA==\r\n\r\n",
        b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Basic c2Vj\x01cmV0\r\n\r\n",
        b"keysvc_" + b"a" * 42 + b" / HTTP/1.1\r\nHost: x\r\n\r\n",
    ],
)
async def test_parser_errors_echo_nothing_of_the_request(
    client: Client, request_bytes: bytes
) -> None:
    """Whichever parser aiohttp runs, the answer is a fixed text: never the bytes sent."""
    answer = await raw(client, request_bytes)
    message = assert_raw_error(answer, 400)
    assert message.startswith("malformed HTTP request: ")
    for fragment in ("c2Vj", "keysvc_", "Basic", "Authorization"):
        assert fragment not in message
