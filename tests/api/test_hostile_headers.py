"""The hostile input corpus: the Authorization header, and what aiohttp's parser
refuses (raw HTTP/1.1 to the test server's port). Every case gets a 4xx envelope
naming the problem, never a 500, a plain-text answer or a hang."""

import pytest

from keysvc.http.auth import MAX_AUTHORIZATION
from keysvc.http.state import SETTINGS
from tests.api.hostile import (
    AUTH_TOO_LONG,
    PARSER_REFUSALS,
    TOO_LONG_LINE,
    Targets,
    assert_raw_error,
    b64,
    expect_error,
    http,
    raw,
    send,
)
from tests.helpers import (
    UNAUTHORIZED,
    Client,
    assert_error,
    assert_ok,
    create_creds,
)

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
