"""Files of the package sent to browsers (the docs page's and the console's): the
Accept-Encoding rule, and a text file gzipped once per process for a client that
accepts gzip."""

import asyncio
import gzip
from collections.abc import Mapping
from functools import cache

from aiohttp import hdrs, web

COMPRESSED_TYPES = ("text/css", "text/javascript")


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding value allows gzip: named, or by ``*``, with q above 0."""
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, *params = (part.strip() for part in item.split(";"))
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        if coding:
            weights[coding.lower()] = weight
    return weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0))) > 0


@cache
def _gzipped(body: bytes) -> bytes:
    # Keyed by the bytes themselves: each caller's file is one cached object, whose
    # hash Python keeps. mtime=0: the same bytes every time, so caches and ETags
    # downstream agree.
    return gzip.compress(body, mtime=0)


async def file_response(
    request: web.Request,
    body: bytes,
    content_type: str,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """``body`` as ``content_type`` with ``headers``; text gzipped when the client accepts it."""
    sent = {hdrs.CONTENT_TYPE: content_type, **(headers or {})}
    if content_type not in COMPRESSED_TYPES:
        return web.Response(body=body, headers=sent)
    sent[hdrs.VARY] = hdrs.ACCEPT_ENCODING
    if not accepts_gzip(request.headers.get(hdrs.ACCEPT_ENCODING, "")):
        return web.Response(body=body, headers=sent)
    sent[hdrs.CONTENT_ENCODING] = "gzip"
    # Off the event loop: the first compression of a large bundle takes a moment.
    gzipped = await asyncio.get_running_loop().run_in_executor(None, _gzipped, body)
    return web.Response(body=gzipped, headers=sent)
