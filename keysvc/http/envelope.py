"""The JSON envelope every answer but verify's and the docs' is written in: the only
module that knows its text.

A success is ``{"status": 200, "requestId": …, "result": …}`` with any more members
after the result (a list's ``nextCursor`` and ``totalCount``); an error is
``{"status": …, "error": …, "requestId": …}``. The plain path (``ok``,
``error_response``) builds the body as a dict for ``web.json_response``. The hot key
routes take the fast path (``envelope``, ``envelope_bytes``): the same text put
together around a result that is JSON already (``keysvc.http.render``), byte for byte
what the plain path sends (tests/unit/test_envelope.py holds the two together).
"""

from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

from aiohttp import web

from keysvc.http.state import REQUEST_ID


def ok_body(request_id: str, result: Any = None, **extra: Any) -> dict[str, Any]:
    """The 200 envelope as a dict; ``result`` is left out when None (as for a delete)."""
    body: dict[str, Any] = {"status": 200, "requestId": request_id}
    if result is not None:
        body["result"] = result
    body.update(extra)
    return body


def ok(request: web.Request, result: Any = None, **extra: Any) -> web.Response:
    """The 200 envelope of ``request``'s answer (see ``ok_body``)."""
    return web.json_response(ok_body(request[REQUEST_ID], result, **extra))


def error_body(request_id: str, status: int, message: str) -> dict[str, object]:
    return {"status": status, "error": message, "requestId": request_id}


def error_response(
    request_id: str, status: int, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(
        error_body(request_id, status, message), status=status, headers=headers
    )


# The 200 envelope's text before the request ID, and between it and the result, as
# json.dumps writes them (", " and ": ", ASCII only, as web.json_response uses it).
_HEAD, _RESULT = '{"status": 200, "requestId": ', ', "result": '
_HEAD_BYTES, _RESULT_BYTES = _HEAD.encode(), _RESULT.encode()


def envelope(request_id: str, result: str, rest: str = "") -> str:
    """The 200 envelope around ``result`` (JSON text); ``rest``: more members as
    ``, "name": value`` text. What ``ok`` would send, as text."""
    return f"{_HEAD}{encode_basestring_ascii(request_id)}{_RESULT}{result}{rest}}}"


def envelope_bytes(request_id: str, result: bytes, rest: bytes = b"") -> bytes:
    """``envelope`` as UTF-8, for a ``result`` and ``rest`` kept as UTF-8 (a list
    page, tens of KiB): copied once into the body, where the envelope's text and
    then its encoding would copy them twice."""
    rid = encode_basestring_ascii(request_id).encode()
    return b"".join((_HEAD_BYTES, rid, _RESULT_BYTES, result, rest, b"}"))


def json_response(text: str) -> web.Response:
    """As ``web.json_response`` answers: application/json in UTF-8."""
    return web.Response(text=text, content_type="application/json")


def json_body_response(body: bytes) -> web.Response:
    """``json_response`` for a body that is UTF-8 already."""
    return web.Response(body=body, content_type="application/json", charset="utf-8")
