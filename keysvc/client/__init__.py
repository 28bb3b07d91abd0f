"""A client of keysvc for Python services, and middlewares that check each request with
keysvc: ``AsyncClient`` (aiohttp) and ``Client`` (the standard library) for the
management API and ``/v1/verify``; ``Verifier`` with ``keysvc_middleware`` (aiohttp)
and ``KeysvcMiddleware`` (ASGI: Starlette, FastAPI). It imports nothing else of keysvc,
so it could ship alone."""

from keysvc.client.aio import AsyncClient
from keysvc.client.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    KeysvcError,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from keysvc.client.middleware_aiohttp import CALLER, keysvc_middleware
from keysvc.client.middleware_asgi import KeysvcMiddleware
from keysvc.client.records import Caller, Page, Tagged
from keysvc.client.sync import Client
from keysvc.client.verifier import Verifier

__all__ = [
    "CALLER",
    "AsyncClient",
    "BadRequest",
    "Caller",
    "Client",
    "Conflict",
    "Forbidden",
    "KeysvcError",
    "KeysvcMiddleware",
    "NotFound",
    "Page",
    "RateLimited",
    "Tagged",
    "Unauthorized",
    "Unavailable",
    "Verifier",
    "keysvc_middleware",
]
