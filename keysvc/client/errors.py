"""The errors a keysvc answer raises in the client: one root, ``KeysvcError``, with the
envelope's ``status``, ``error`` message and ``requestId``, and a small subclass per
status family, so a caller catches what it can act on (flask-smorest's habit)."""

from collections.abc import Mapping
from typing import Any


class KeysvcError(Exception):
    """keysvc refused or failed a call; ``request_id`` is None when no envelope came."""

    def __init__(
        self,
        status: int,
        message: str,
        request_id: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(f"{status}: {message}" + (f" (requestId {request_id})" * bool(request_id)))
        self.status = status
        self.message = message
        self.request_id = request_id
        self.retry_after = retry_after


class BadRequest(KeysvcError):
    """400: the call's input was refused; the message names the field."""


class Unauthorized(KeysvcError):
    """401: the credentials are missing, wrong, disabled or expired."""


class Forbidden(KeysvcError):
    """403: the key may not do this (permission, organization, IP access list)."""


class NotFound(KeysvcError):
    """404: no such key, role or route in this organization."""


class Conflict(KeysvcError):
    """409 or 412: the state changed or forbids it (a stale If-Match is a 412)."""


class RateLimited(KeysvcError):
    """429: over a limit or out of credits; ``retry_after`` in seconds when one is due."""


class Unavailable(KeysvcError):
    """503, or keysvc unreachable or answering 5xx: try again after ``retry_after``."""


_BY_STATUS: dict[int, type[KeysvcError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: Conflict,
    429: RateLimited,
}


def retry_after(headers: Mapping[str, str]) -> int | None:
    """Retry-After in whole seconds, None when absent or not a number."""
    value = headers.get("Retry-After", "")
    return int(value) if value.isascii() and value.isdigit() else None


def error_from(status: int, body: Any, headers: Mapping[str, str]) -> KeysvcError:
    """The exception of a refused answer: its class from the status (any other 5xx is
    ``Unavailable``), the message and requestId from the envelope when there is one."""
    envelope = body if isinstance(body, dict) else {}
    message = envelope.get("error")
    request_id = envelope.get("requestId") or headers.get("X-Request-Id")
    kind = _BY_STATUS.get(status, Unavailable if status >= 500 else KeysvcError)
    return kind(
        status,
        message if isinstance(message, str) else f"HTTP {status}",
        request_id if isinstance(request_id, str) else None,
        retry_after(headers),
    )
