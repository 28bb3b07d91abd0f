"""What every view needs: the success envelope, the JSON body, path UUIDs."""

import json
from typing import Any

from aiohttp import web

from keysvc.errors import BadRequest, UnsupportedMediaType
from keysvc.schemas import UUID_PATTERN
from keysvc.state import REQUEST_ID


def ok(request: web.Request, result: Any = None, **extra: Any) -> web.Response:
    """The 200 envelope; ``result`` is left out when None (as for a delete)."""
    body: dict[str, Any] = {"status": 200, "requestId": request[REQUEST_ID]}
    if result is not None:
        body["result"] = result
    body.update(extra)
    return web.json_response(body)


def path_uuid(request: web.Request, name: str) -> str:
    """A path parameter that must be a UUID in canonical lowercase form."""
    value = request.match_info[name]
    if not UUID_PATTERN.fullmatch(value):
        raise BadRequest(
            f"{name}: must be a lowercase UUID such as 123e4567-e89b-42d3-a456-426614174000"
        )
    return value


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


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise _DuplicateKey(name)
        result[name] = value
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or a 4xx that says what is wrong with it.

    Oversized bodies raise aiohttp's 413 from ``read``; the error middleware
    answers it in the envelope.
    """
    if request.content_type != "application/json":
        raise UnsupportedMediaType()
    raw = await request.read()
    if not raw.strip():
        raise BadRequest("body: is required; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("body: is not valid UTF-8") from None
    try:
        value = json.loads(text, object_pairs_hook=_object, parse_constant=_no_constant)
    except _DuplicateKey as exc:
        raise BadRequest(f"body: field {str(exc)[:64]!r} appears more than once") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(
            f"body: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise BadRequest("body: JSON is nested too deeply") from None
    except ValueError as exc:
        raise BadRequest(f"body: invalid JSON: {str(exc)[:100]}") from None
    if not isinstance(value, dict):
        raise BadRequest("body: must be a JSON object")
    return value
