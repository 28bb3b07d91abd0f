"""The reuse bound a ``/v1/verify`` answer states to the proxy in front of it, from the
rule in ``keysvc.domain.reuse``: ``X-Accel-Expires`` (nginx reads it first, and keeps to
it alone in the shipped config) and ``Cache-Control`` for any other cache.

A 200 and a refusal (401, 403) may be reused for the bound; anything else (a 400, a 429,
a 503) says not at all (``X-Accel-Expires: 0``, ``Cache-Control: no-store``), as does
an answer of a key keysvc must see every request of (a request limit, credits) and a
JSON answer, whose body depends on the Accept header. The bound holds only for a cache
whose key covers all the answer depends on: the Authorization header, the
X-Required-Organization and X-Required-Permission headers and the X-Forwarded-For
header keysvc receives (the client address, for IP access lists): docs/SECURITY.md,
"Reused verify answers". Requirements given in the query are not in that key, so their
answers say not at all. Every answer names those headers, with X-Credit-Cost and
Accept (a bad cost is a 400, a JSON Accept gets another body), in ``Vary``: a standard
HTTP cache keys its entries on them.
"""

import math
from collections.abc import Mapping
from datetime import datetime
from types import MappingProxyType

from aiohttp import web

from keysvc.config import Settings
from keysvc.domain.reuse import Reuse, reuse_bound
from keysvc.http.state import CALLER, CLOCK, KEPT_REUSE, PREVIOUS_CREDENTIAL, SETTINGS, KeptReuse
from keysvc.models import Key

# Every request header a verify answer depends on, besides the URL.
VARY = (
    "Authorization, X-Required-Organization, X-Required-Permission, X-Forwarded-For, "
    "X-Credit-Cost, X-Ratelimit, Accept"
)
NO_REUSE = {"X-Accel-Expires": "0", "Cache-Control": "no-store", "Vary": VARY}
# What the OpenAPI document says of them (keysvc.http.openapi), on each verify answer but a 500.
REUSE_HEADERS_DOCUMENTED = {
    "X-Accel-Expires": {
        "description": "How long a proxy may reuse this answer, for nginx: `@` and the last "
        "whole unix second it may be served in (nginx's cache clock counts whole seconds), "
        "within KEYSVC_VERIFY_REUSE_SECONDS, the key's expireAt and, when the answer used a "
        "rotated key's previous credentials, their grace; `0`: not at all (a key with a "
        "request limit or credits, a 400, a 429, a JSON answer, anything given in the query, "
        "or the setting at 0). "
        "It holds for a cache whose key covers Authorization, X-Required-Organization, "
        "X-Required-Permission and X-Forwarded-For.",
        "schema": {"type": "string", "pattern": "^(?:0|@[0-9]+)$"},
    },
    "Cache-Control": {
        "description": "The same bound for other caches: `private, max-age=N` (whole "
        "seconds from now), or `no-store`.",
        "schema": {"type": "string", "pattern": "^(?:no-store|private, max-age=[0-9]+)$"},
    },
    "Vary": {
        "description": "The request headers the answer depends on, besides the URL: a cache "
        "keys a reused answer on them.",
        "schema": {"type": "string", "enum": [VARY]},
    },
}
# The statuses whose answer may be reused: a 429 must be seen again, and others are errors.
REUSABLE = frozenset({200, 401, 403})


def must_see_every_request(caller: Key, settings: Settings) -> bool:
    """Whether every request of ``caller``'s key must reach keysvc: it has a request
    limit (its own or the server's) or named rate limits, which count each one, or
    credits, which each request spends."""
    return (
        (caller.rate_limit or settings.rate_limit) is not None
        or caller.credits is not None
        or caller.ratelimits is not None
    )


def reuse_headers(
    request: web.Request, status: int, caller: Key | None = None
) -> Mapping[str, str]:
    """The headers that say how long the verify answer of ``status`` to ``request`` may
    be reused: within the setting, the caller's key's expiry and, when it used its
    previous credentials, their grace. A refusal before the key was admitted (a 401, or
    the 403 of an IP access list) ends with nothing sooner than the setting's bound.
    ``caller``: the admitted caller, when the view has it at hand (else read from the
    request). Read-only: the same headers serve every answer they fit (``_within_setting``)."""
    app = request.app
    settings = app[SETTINGS]
    seconds = settings.verify_reuse_seconds
    if not seconds or status not in REUSABLE or request.query_string:
        return _NOT_REUSED
    if caller is None:
        caller = request.get(CALLER)
        if caller is None:
            return _within_setting(app[KEPT_REUSE], app[CLOCK](), seconds)
    if must_see_every_request(caller, settings):
        return _NOT_REUSED  # the rule's every_request: never reused
    # The grace counts only for an answer that used the previous credentials.
    grace = caller.previous_until
    if grace is not None and not request.get(PREVIOUS_CREDENTIAL, False):
        grace = None
    if grace is None and caller.expire_at is None:
        return _within_setting(app[KEPT_REUSE], app[CLOCK](), seconds)
    bound = reuse_bound(app[CLOCK](), seconds, ends=(caller.expire_at, grace))
    return _NOT_REUSED if bound is None else _headers(bound)


_NOT_REUSED: Mapping[str, str] = MappingProxyType(NO_REUSE)


def _headers(bound: Reuse) -> Mapping[str, str]:
    return MappingProxyType(
        {
            "X-Accel-Expires": f"@{bound.last_second}",
            "Cache-Control": f"private, max-age={bound.max_age}",
            "Vary": VARY,
        }
    )


def _within_setting(state: KeptReuse, now: datetime, seconds: int) -> Mapping[str, str]:
    """The headers of an answer given at ``now`` that nothing ends sooner than the
    setting's ``seconds``: its bound is a function of the whole second alone (the rule's
    ``reuse_bound`` with no ends), so the second's first such answer makes them and the
    rest of that second's reuse them, as most verify answers are. Kept per application:
    another app in the process (a test's, with a clock of its own) keeps its own."""
    second = math.floor(now.timestamp())
    kept = state.kept
    if kept[0] == second and kept[1] == seconds and kept[2] is not None:
        return kept[2]
    bound = reuse_bound(now, seconds)
    headers = _NOT_REUSED if bound is None else _headers(bound)
    state.kept = (second, seconds, headers)
    return headers
