"""How long a proxy may reuse a forward-auth (``/v1/verify``) answer: the pure rule
behind its ``X-Accel-Expires`` and ``Cache-Control`` headers (``keysvc.http.reuse``).

An answer may be reused for at most the configured seconds (``KEYSVC_VERIFY_REUSE_SECONDS``),
never past the key's expiry nor past the end of the grace of a rotated key's previous
credentials when the answer used them, and not at all when keysvc must see every
request (a key with a request limit: each request must be counted against it).

nginx's cache clock counts whole seconds, and keeps an entry while that clock is at or
before the entry's end: a relative ``X-Accel-Expires: 1`` stored early in one second is
still served at the end of the next, up to 2 s later. So the bound is given as the
last whole unix second the answer may be served in (``X-Accel-Expires: @<second>``),
the second before the one its reuse must end in: then no cache that counts whole
seconds serves it past the bound.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Reuse:
    """An answer's reuse bound. ``last_second``: the last whole unix second a cache whose
    clock counts whole seconds (nginx) may serve it in; ``max_age``: the whole seconds
    any other cache may serve it for, counted from now (it may be 0)."""

    last_second: int
    max_age: int


def reuse_bound(
    now: datetime,
    seconds: int,
    *,
    every_request: bool = False,
    ends: Iterable[datetime | None] = (),
) -> Reuse | None:
    """How long an answer given at ``now`` may be reused, at most ``seconds`` and never
    past any of ``ends`` (the moments it stops being true: the key's expiry, its previous
    credentials' grace end; None for none); None when it may not be reused at all:
    ``seconds`` is 0, keysvc must see every request (``every_request``), or no whole
    second is left before the earliest end."""
    if seconds <= 0 or every_request:
        return None
    start = now.timestamp()
    end = min([start + seconds, *(moment.timestamp() for moment in ends if moment is not None)])
    last_second = math.floor(end) - 1  # served while the cache's clock reads it, until `end`
    if last_second < math.floor(start):
        return None
    return Reuse(last_second, math.floor(end - start))
