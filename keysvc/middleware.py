"""The error-envelope middleware: a fresh request ID on every request, and
every failure, aiohttp's own 404/405/413 included, answered in the JSON
envelope. A 500 shows nothing of the cause; it is logged with its request ID.
This is the only place that writes an error body."""

import logging
import uuid
from collections.abc import Mapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from keysvc.errors import ApiError
from keysvc.state import REQUEST_ID, SETTINGS


def error_body(request_id: str, status: int, message: str) -> dict[str, object]:
    return {"status": status, "error": message, "requestId": request_id}


def _error_response(
    request_id: str, status: int, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(
        error_body(request_id, status, message), status=status, headers=headers
    )


def _from_http_exception(
    request: web.Request, request_id: str, exc: web.HTTPException
) -> web.Response:
    headers = {name: value for name, value in exc.headers.items() if name in ("Allow",)}
    if isinstance(exc, web.HTTPNotFound):
        message = "not found: no such endpoint"
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"method {request.method} is not allowed here; allowed: {allowed}"
    elif isinstance(exc, web.HTTPRequestEntityTooLarge):
        message = (
            f"request body too large: the limit is {request.app[SETTINGS].max_body_bytes} bytes"
        )
    else:
        message = exc.reason
    return _error_response(request_id, exc.status, message, headers)


def error_middleware(*, logger: logging.Logger) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = str(uuid.uuid4())
        request[REQUEST_ID] = request_id
        try:
            response = await handler(request)
        except ApiError as exc:
            response = _error_response(request_id, exc.status, exc.message, exc.headers)
        except web.HTTPException as exc:
            response = _from_http_exception(request, request_id, exc)
        except Exception:
            logger.exception("internal error, requestId=%s", request_id)
            response = _error_response(request_id, 500, "internal server error")
        response.headers["X-Request-Id"] = request_id
        return response

    return middleware
