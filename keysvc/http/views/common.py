"""What every view needs: the JSON body, path UUIDs, the query string, the authorized
caller, and who the caller is for the activity log."""

import asyncio
import json
import math
import re
from typing import Any

from aiohttp import hdrs, web

from keysvc.domain.activities import api_actor
from keysvc.domain.limits import MAX_BODY_DEPTH
from keysvc.errors import BadRequest, RequestTimeout, UnsupportedMediaType
from keysvc.http.middleware import parser_error_text
from keysvc.http.routes import path_uuid as path_uuid
from keysvc.http.state import CALLER, CLIENT_ADDRESS, SETTINGS
from keysvc.models import Actor, Key
from keysvc.nesting import depth_of, may_nest_deeper


def authorized(request: web.Request) -> tuple[Key, str]:
    """The caller, and the organization of the path: the caller's own, as the route's
    permission was checked for it before the view ran (``keysvc.http.auth.guarded``)."""
    caller: Key = request[CALLER]
    return caller, caller.organization_id


def actor(request: web.Request) -> Actor:
    """The admitted caller as the actor of the activities its write records: its key,
    the client address keysvc believes and its User-Agent (bounded)."""
    return api_actor(
        request[CALLER], request.get(CLIENT_ADDRESS), request.headers.get(hdrs.USER_AGENT)
    )


def query(request: web.Request) -> dict[str, str]:
    """The query string as a plain dict; a parameter given twice is a 400."""
    result: dict[str, str] = {}
    for name, value in request.query.items():
        if name in result:
            raise BadRequest(f"{name[:64]}: given more than once")
        result[name] = value
    return result


class _DuplicateKey(ValueError):
    pass


class _Refused(ValueError):
    """JSON that Python would parse but keysvc does not take; the text says why."""


BODY_REQUIRED = "body: is required; send a JSON object"
# The answer to a body nested deeper than MAX_BODY_DEPTH, whatever noticed it first.
TOO_DEEP = "body: JSON is nested too deeply"

# Far more digits than any field takes, far fewer than Python's own limit (4300).
MAX_DIGITS = 100


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise _DuplicateKey(name)
        result[name] = value
    return result


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not valid JSON")


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused(f"a number has more than {MAX_DIGITS} digits")
    return int(text)


def _real(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:20]} is out of range")
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = "holds a lone surrogate escape (\\ud800 to \\udfff), which is not a character"


def _lone_surrogate(value: Any) -> str | None:
    """The error for the first string holding a lone surrogate such as "\\ud800".

    json.loads lets such escapes through, but they are not characters: they
    cannot be stored as UTF-8 (SQLite refuses them), compared or shown.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str) and not _utf8(item):
            return f"{path}: {_SURROGATE}"
        # Paths are cut short as they are built: long names nested deep stay cheap.
        if isinstance(item, dict):
            for name, inner in item.items():
                if not _utf8(name):
                    return f"{path or 'body'}: a field name {_SURROGATE}"
                stack.append(((f"{path}.{name}" if path else name)[:100], inner))
        elif isinstance(item, list):
            stack.extend((f"{path}.{index}"[:100], inner) for index, inner in enumerate(item))
    return None


async def _read_body(request: web.Request) -> bytes:
    max_size = request.app[SETTINGS].max_body_bytes
    # Refused before reading: a client that announces a huge body and never
    # sends it gets its answer now rather than waiting on the socket.
    if request.content_length is not None and request.content_length > max_size:
        raise web.HTTPRequestEntityTooLarge(max_size, request.content_length)
    timeout = request.app[SETTINGS].header_timeout
    try:
        # As long as a head may take: a body that stops arriving would otherwise hold
        # its connection, one of the capped number, for as long as the client likes.
        async with asyncio.timeout(timeout):
            return await request.read()
    except TimeoutError:
        raise RequestTimeout(f"body: not received within {timeout:g} s") from None
    except web.RequestPayloadError as exc:
        # Broken chunked framing or Content-Encoding: the body cannot be read.
        raise BadRequest(f"body: could not be read: {parser_error_text(exc.__cause__)}") from None


async def read_optional_json_object(request: web.Request) -> dict[str, Any]:
    """As ``read_json_object``, for a route whose body may be left out: none is ``{}``."""
    if not request.body_exists:
        return {}
    return await read_json_object(request)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or a 4xx that says what is wrong with it.

    A body over the limit is a 413 (from Content-Length before reading, or from
    aiohttp's ``read`` while reading); the error middleware answers it in the
    envelope. No body at all is a 400 whatever the Content-Type: the type of
    nothing is not what is wrong.
    """
    if not request.body_exists:
        raise BadRequest(BODY_REQUIRED)
    if request.content_type != "application/json":
        raise UnsupportedMediaType()
    value: dict[str, Any] = decode_json(await _read_body(request), dict, "a JSON object")
    return value


async def read_raw_body(request: web.Request) -> bytes:
    """The body's bytes as sent, within the size limit (413) and the body timeout: for a
    view that checks a signature over them before it reads them (``decode_json``)."""
    return await _read_body(request)


def decode_json(raw: bytes, kind: type, what: str) -> Any:
    """A body's JSON value, of ``kind`` (``what`` names it: "a JSON object"), or a 400
    that says what is wrong with it: strict UTF-8, no repeated field, no NaN or
    Infinity, bounded numbers, nesting at most ``MAX_BODY_DEPTH`` levels (measured
    without recursion, so that nothing after it recurses that deep: ``keysvc.nesting``),
    no lone surrogate escape."""
    if not raw.strip():
        raise BadRequest(BODY_REQUIRED)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body: is not valid UTF-8") from None
    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_constant=_no_constant,
            parse_int=_integer,
            parse_float=_real,
        )
    except _DuplicateKey as exc:
        raise BadRequest(f"body: field {str(exc)[:64]!r} appears more than once") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"body: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise BadRequest(TOO_DEEP) from None
    except ValueError as exc:
        raise BadRequest(f"body: invalid JSON: {str(exc)[:100]}") from None
    if may_nest_deeper(text, MAX_BODY_DEPTH) and depth_of(value) > MAX_BODY_DEPTH:
        raise BadRequest(TOO_DEEP)
    if not isinstance(value, kind):
        raise BadRequest(f"body: must be {what}")
    # Only a \ud800-style escape makes a lone surrogate (the bytes were strict UTF-8): a
    # body without one is not walked, so a long list costs no more than its parsing.
    surrogate = _lone_surrogate(value) if _SURROGATE_ESCAPE.search(text) else None
    if surrogate is not None:
        raise BadRequest(surrogate)
    return value


def if_match(request: web.Request) -> list[str] | None:
    """The entity tags of If-Match, or None without one."""
    given = request.headers.get(hdrs.IF_MATCH)
    return None if given is None else [tag.strip() for tag in given.split(",")]
