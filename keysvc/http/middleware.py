"""keysvc's middleware: a fresh request ID on every request, and every failure,
aiohttp's own 404/405/413 included, answered in the JSON envelope; a 500 shows nothing
of its cause and is logged with its request ID. This is the only place that answers
with an error envelope (whose text ``keysvc.http.envelope`` owns).

aiohttp answers the requests its parser refuses itself, in plain text, from
``RequestHandler.handle_error``, which offers no hook: ``answer_parser_errors_in_envelope``
wraps that method so that a keysvc app answers them in the envelope too, and logs one
short throttled line (``keysvc.logs.Throttled``) instead of a traceback quoting the
request's bytes. An HTTP/1.0 request with Transfer-Encoding (RFC 9112, 6.1) is
answered 400 and its connection closed.
"""

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Iterator
from http import HTTPStatus

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import (
    BadStatusLine,
    ContentEncodingError,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)
from aiohttp.typedefs import Handler, Middleware

from keysvc.errors import ApiError, BadFraming
from keysvc.http.access import Access
from keysvc.http.auth import guarded
from keysvc.http.envelope import error_response
from keysvc.http.routing import literal_methods
from keysvc.http.state import PARSER_ERROR_LOG, REQUEST_ID, SETTINGS, InFlight
from keysvc.logs import Throttled

# nginx's code for a client that went away before the answer was ready.
CLIENT_CLOSED = 499


def _from_http_exception(
    request: web.Request, request_id: str, exc: web.HTTPException
) -> web.Response:
    headers = {name: value for name, value in exc.headers.items() if name in ("Allow",)}
    if isinstance(exc, web.HTTPNotFound):
        message = "not found: no such endpoint"
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        methods = literal_methods(request.path) or sorted(exc.allowed_methods)
        headers["Allow"] = ",".join(methods)
        allowed = ", ".join(methods)
        message = f"method {request.method} is not allowed here; allowed: {allowed}"
    elif isinstance(exc, web.HTTPRequestEntityTooLarge):
        message = (
            f"request body too large: the limit is {request.app[SETTINGS].max_body_bytes} bytes"
        )
    else:
        message = exc.reason
    response = error_response(request_id, exc.status, message, headers)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        # The rest of the body is never read, so the connection cannot carry another request.
        response.force_close()
    return response


# Random bytes for request IDs, read from the OS a pool at a time: one getrandom
# call per REQUEST_IDS_PER_POOL requests rather than one per request, which under
# load cost more than the rest of making the ID. Each pool (kept as hex) comes with
# its own counter, and both are swapped in as one tuple, so whichever thread asks,
# each slice of a pool is handed out once (next() on itertools.count is atomic under
# the GIL; a free-threaded build would need a lock here).
REQUEST_IDS_PER_POOL = 256
# The RFC 4122 variant's four possible first hex digits (10xx), by the random digit.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def _new_pool() -> None:
    global _pool
    _pool = (os.urandom(16 * REQUEST_IDS_PER_POOL).hex(), itertools.count())


_pool: tuple[str, Iterator[int]]
_new_pool()
# A forked worker must not hand out the IDs its parent has yet to hand out.
os.register_at_fork(after_in_child=_new_pool)


def new_request_id() -> str:
    """A fresh random UUIDv4, as text, from the OS's CSPRNG (see ``_pool``)."""
    digits, taken = _pool
    index = next(taken)
    if index >= REQUEST_IDS_PER_POOL:
        _new_pool()
        return new_request_id()
    h = digits[32 * index : 32 * index + 32]
    # 122 random bits: the version digit is 4, and the variant takes two bits.
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


def service_middleware(
    *, logger: logging.Logger, access: Access, in_flight: InFlight
) -> Middleware:
    """keysvc's one middleware, around every request:

    - a fresh request ID, sent back as ``X-Request-Id``;
    - the caller authenticated, unless the route is public (``keysvc.http.auth.guarded``);
    - every failure answered in the envelope, a 500 logged with its request ID;
    - the access record of the answer as sent (``keysvc.http.access``);
    - the requests in flight, which a shutdown waits for (``keysvc.cli``), counted.

    One layer rather than one per concern: each aiohttp middleware is another
    coroutine and partial on every request.
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        request_id = new_request_id()
        request[REQUEST_ID] = request_id
        status = 500  # only if something escapes the handling below
        in_flight.count += 1
        try:
            try:
                if request.version < HttpVersion11 and hdrs.TRANSFER_ENCODING in request.headers:
                    raise BadFraming()
                response = await guarded(request, handler)
            except ApiError as exc:
                response = error_response(request_id, exc.status, exc.message, exc.headers)
                if exc.closes:
                    response.force_close()
            except web.HTTPException as exc:
                response = _from_http_exception(request, request_id, exc)
            except Exception:
                logger.exception("internal error, requestId=%s", request_id)
                response = error_response(request_id, 500, "internal server error")
            response.headers["X-Request-Id"] = request_id
            status = response.status
            return response
        except asyncio.CancelledError:
            status = CLIENT_CLOSED
            raise
        finally:
            in_flight.count -= 1
            access.record(request, request_id, status, time.perf_counter() - started)

    return middleware


# aiohttp's parser limits (8190 by default), raised so that an 8 KiB header
# reaches keysvc, which then says what is wrong with it.
MAX_LINE_BYTES = 16 * 1024
PARSER_LIMITS = {"max_line_size": MAX_LINE_BYTES, "max_field_size": MAX_LINE_BYTES}
_aiohttp_handle_error = web.RequestHandler.handle_error
# At most this many log lines on unparseable requests per this many seconds, per app.
PARSER_ERROR_LINES = 10
PARSER_ERROR_SECONDS = 10.0


# What each of aiohttp's parser errors is called in an answer. Fixed texts only:
# depending on the parser (C or pure Python), aiohttp's own messages quote the
# request's bytes, which may hold credentials, and nothing of a request is echoed.
_PARSER_ERRORS: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (InvalidHeader, "invalid header"),
    (BadStatusLine, "invalid request line"),
    (InvalidURLError, "invalid URL"),
    (ContentLengthError, "invalid Content-Length"),
    (TransferEncodingError, "invalid chunked framing"),
    (ContentEncodingError, "invalid Content-Encoding"),
)


def parser_error_text(exc: BaseException | None) -> str:
    """A fixed description of an aiohttp parser error."""
    for kind, text in _PARSER_ERRORS:
        if isinstance(exc, kind):
            return text
    return "it could not be parsed"


_TOO_LONG = "request line or header too long"


def _parser_error_kind(exc: BaseException | None) -> str:
    return _TOO_LONG if isinstance(exc, LineTooLong) else parser_error_text(exc)


def _parser_error_message(exc: BaseException | None) -> str:
    if isinstance(exc, LineTooLong):
        return f"{_TOO_LONG}: each may be at most {MAX_LINE_BYTES} bytes"
    return f"malformed HTTP request: {parser_error_text(exc)}"


def _handle_error(
    self: web.RequestHandler,
    request: web.BaseRequest,
    status: int = 500,
    exc: BaseException | None = None,
    message: str | None = None,
) -> web.StreamResponse:
    # The server's handler: the application's own, or keysvc.http.dispatch's, which
    # holds it as ``app``.
    owner = getattr(self._request_handler, "__self__", None)
    app = owner if isinstance(owner, web.Application) else getattr(owner, "app", None)
    if not isinstance(app, web.Application) or SETTINGS not in app:
        return _aiohttp_handle_error(self, request, status, exc, message)  # not keysvc's
    request_id = new_request_id()
    if status >= 500:
        # A failure outside the middlewares: aiohttp logs it, traceback and all, and
        # nothing of it is shown.
        _aiohttp_handle_error(self, request, status, exc, message)
        text = HTTPStatus(status).phrase.lower()
    else:
        # Only the parser answers below 500 here; as aiohttp does, no second answer
        # goes after part of a first.
        if request.writer.output_size > 0:
            raise ConnectionError("part of a response was sent; no error answer can follow")
        text = _parser_error_message(exc)
        app[PARSER_ERROR_LOG].log(
            "unparseable request answered %d: %s",
            status,
            _parser_error_kind(exc),
            extra={"requestId": request_id, "remote": request.remote},
        )
        # keysvc serve's connections: closed without resetting a client still sending.
        linger = getattr(self, "linger", None)
        if linger is not None:
            linger()
    envelope = error_response(request_id, status, text)
    envelope.headers["X-Request-Id"] = request_id
    envelope.force_close()
    return envelope


def parser_error_log(logger: logging.Logger) -> Throttled:
    """Where ``_handle_error`` logs the requests the parser refuses, for one app."""
    return Throttled(
        logger,
        logging.WARNING,
        burst=PARSER_ERROR_LINES,
        interval=PARSER_ERROR_SECONDS,
        summary="left out %d more lines on unparseable requests in the last %g s",
    )


def answer_parser_errors_in_envelope() -> None:
    """Make aiohttp's own answers to unparseable requests envelopes (idempotent)."""
    web.RequestHandler.handle_error = _handle_error  # type: ignore[method-assign]
