"""One envelope: the fast path the hot key routes take writes, byte for byte and with
the same Content-Type, what the plain path writes for the same result."""

import json
from typing import Any

import pytest
from aiohttp import web

from keysvc.http import envelope
from keysvc.http.render import encode, key_json, keys_json
from tests.records import KEYS

RID = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e0000aa"


def _plain(result: Any, **extra: Any) -> web.Response:
    return web.json_response(envelope.ok_body(RID, result, **extra))


def _same(fast: web.Response, plain: web.Response) -> None:
    assert fast.body == plain.body
    assert fast.content_type == plain.content_type == "application/json"
    assert fast.charset == plain.charset == "utf-8"


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.name[:12])
def test_one_key_fast_and_plain_are_equal(key: Any) -> None:
    fast = envelope.json_response(envelope.envelope(RID, key_json(key)))
    _same(fast, _plain(json.loads(key_json(key))))


@pytest.mark.parametrize("cursor", [None, "next \u00e9"])
def test_a_list_page_fast_and_plain_are_equal(cursor: str | None) -> None:
    rest = f', "nextCursor": {encode(cursor)}, "totalCount": {encode(len(KEYS))}'
    body = envelope.envelope_bytes(RID, keys_json(KEYS).encode(), rest.encode())
    plain = _plain(json.loads(keys_json(KEYS)), nextCursor=cursor, totalCount=len(KEYS))
    _same(envelope.json_body_response(body), plain)


def test_the_error_envelope() -> None:
    response = envelope.error_response(RID, 404, "not found: \u00e9", {"Allow": "GET"})
    assert response.status == 404 and response.headers["Allow"] == "GET"
    assert json.loads(response.text or "") == {
        "status": 404,
        "error": "not found: \u00e9",
        "requestId": RID,
    }
