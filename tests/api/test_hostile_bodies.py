"""The hostile input corpus: the JSON body, its encoding, type, size and framing.
Every case gets a 4xx envelope naming the problem, never a 500,
a plain-text answer or a hang."""

import io
from collections.abc import AsyncIterator

import pytest

from keysvc.config import MAX_BODY_BYTES
from tests.api.hostile import (
    BODY_ENDPOINTS,
    METHODS,
    NOT_JSON,
    SURROGATE,
    TEN_MB,
    TOO_LARGE,
    Targets,
    assert_raw_error,
    expect_error,
    http,
    raw,
    send,
)
from tests.helpers import (
    Client,
    assert_error,
    assert_ok,
)

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
