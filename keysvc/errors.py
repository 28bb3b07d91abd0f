"""The exception tree. Every error the service answers with is one of these.

Each class knows its HTTP status, and its message is written for the caller: it
is safe to show and says what to change. The error middleware is the only
place that turns one into a response body. Nothing here imports aiohttp, so
the store may raise these too.
"""

from collections.abc import Mapping


class ApiError(Exception):
    """Root of every error with a status; the message is shown to the caller."""

    status = 500
    default_message = "internal server error"
    # Whether the connection is closed after the answer: the request's end is unknown.
    closes = False

    def __init__(self, message: str | None = None, *, headers: Mapping[str, str] | None = None):
        self.message = message or self.default_message
        self.headers: dict[str, str] = dict(headers or {})
        super().__init__(self.message)


class BadRequest(ApiError):
    """The request is malformed or a field is invalid."""

    status = 400
    default_message = "bad request"


class BadFraming(BadRequest):
    """Where the request ends cannot be trusted; answered, then the connection closed."""

    closes = True

    default_message = (
        "malformed HTTP request: Transfer-Encoding is not allowed in HTTP/1.0;"
        " send HTTP/1.1, or a Content-Length"
    )


class Unauthorized(ApiError):
    """The credentials are missing, wrong, or belong to an unusable key."""

    status = 401
    default_message = "invalid credentials: send Authorization: Basic base64(keyId:keySecret)"

    def __init__(self, message: str | None = None):
        super().__init__(message, headers={"WWW-Authenticate": 'Basic realm="keysvc"'})


class BearerUnauthorized(ApiError):
    """The bearer token a route needs (``/metrics``'s) is missing or wrong."""

    status = 401
    default_message = "invalid credentials: send Authorization: Bearer <the metrics token>"

    def __init__(self, message: str | None = None):
        super().__init__(message, headers={"WWW-Authenticate": 'Bearer realm="keysvc metrics"'})


class Forbidden(ApiError):
    """The key is valid but may not do this."""

    status = 403
    default_message = "forbidden"


class NotFound(ApiError):
    """The resource or route does not exist (or is not visible to the caller)."""

    status = 404
    default_message = "not found"


class Conflict(ApiError):
    """The request clashes with existing state."""

    status = 409
    default_message = "conflict"


class UnsupportedMediaType(ApiError):
    """The request body is not JSON."""

    status = 415
    default_message = "request body must be JSON: send Content-Type: application/json"


class RequestTimeout(ApiError):
    """The body did not arrive in time; answered, then the connection closed."""

    status = 408
    default_message = "request body not received in time"
    closes = True


class PreconditionFailed(ApiError):
    """If-Match named a version that is no longer current."""

    status = 412
    default_message = "the key has changed since you read it (If-Match does not match its ETag)"


class ServiceUnavailable(ApiError):
    """The service cannot answer requests yet (or any more)."""

    status = 503
    default_message = "service unavailable"


class DatabaseUnavailable(ServiceUnavailable):
    """The database does not answer (stopped, unreachable, its connections dropped):
    nothing was done; Retry-After says when to try again."""

    default_message = "database unavailable"
    retry_after = 5

    def __init__(self, message: str | None = None):
        super().__init__(message, headers={"Retry-After": str(self.retry_after)})


class InsufficientStorage(ApiError):
    """The database's disk is full: nothing was written, and reads still work."""

    status = 507
    default_message = (
        "database disk is full: nothing was written; try again once the server has space"
    )


class TooManyRequests(ApiError):
    """Over a rate limit; Retry-After says when to come back."""

    status = 429
    default_message = "too many requests"

    def __init__(self, message: str, *, retry_after: int, headers: dict[str, str] | None = None):
        super().__init__(message, headers={"Retry-After": str(retry_after), **(headers or {})})
