"""Forward-auth verification for the services next to keysvc.

Any method, so it serves as nginx ``auth_request``, Caddy ``forward_auth`` and
Traefik ``ForwardAuth`` alike (an Envoy ``ext_authz`` HTTP service appends the request's
path, so it needs a rewrite to ``/v1/verify``: docs/forward-auth/caddy.md). The caller's forwarded
``Authorization`` was already checked by the auth middleware, with the same
rules as the management API (secret, state, expiry, IP access list, rate
limits). Here only what the proxy asks for is checked: the organization the key
must belong to and the permissions it must hold. Success is 200 with an empty
body and headers the proxy can pass upstream; failures are envelopes, so
whoever reads the proxy's logs sees why. Every answer says how long the proxy may
reuse it (``keysvc.http.reuse``: ``X-Accel-Expires`` and ``Cache-Control``), the
refusals' from ``keysvc.http.auth.guarded``, which sees them all.

A key with credits spends the request's cost (``X-Credit-Cost`` or
``?cost=``, default 1) once every other check has passed, exactly, in the database
(``keysvc.domain.keycredits.spend``, never from a cache); not enough is a 429. Every
answer about such a key says that no proxy may reuse it
(``keysvc.http.reuse.must_see_every_request``). A 200 names the key's externalId
(``X-Key-External-Id``, percent-encoded UTF-8: always ASCII on the wire), and
``Accept: application/json`` gets the whole answer as an envelope.

Named rate limits (issue 36, ``keysvc.domain.namedcount`` states which are checked and at
what cost): after the organization and permission checks and before credits are spent,
the key's autoApply limits and those the verify names are checked, then counted only if
every one of them fits (``keysvc.domain.ratelimit.Limits.named``); past one, a 429 with
its Retry-After and X-RateLimit-* headers. A key with named limits is never reused by a
proxy, and the JSON answer lists every limit checked.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any, NoReturn

from aiohttp import hdrs, web
from multidict import istr

from keysvc.domain import credits as rules
from keysvc.domain import identities, keycredits, namedcount, permquery
from keysvc.domain.credits import MAX_COST
from keysvc.domain.permquery import Query
from keysvc.domain.ratelimit import Decision
from keysvc.errors import ApiError, BadRequest, TooManyRequests
from keysvc.http import render
from keysvc.http.auth import authorize_organization, authorize_query
from keysvc.http.envelope import envelope, json_response
from keysvc.http.reuse import NO_REUSE, reuse_headers
from keysvc.http.routes import VERIFY, serves
from keysvc.http.schemas import UUID_PATTERN
from keysvc.http.state import (
    CALLER,
    CLOCK,
    LIMITS,
    RATE_DECISION,
    REQUEST_ID,
    STORE,
    USAGE_REFUSAL,
)
from keysvc.models import Credits, Key, Spent

# Header names as istr: a case-insensitive lookup of one folds its case once, not per request.
_PERMISSION = ("permission", istr("X-Required-Permission"))
_ORGANIZATION = ("organization", istr("X-Required-Organization"))


def _asked(request: web.Request, what: tuple[str, str]) -> list[str]:
    """The values asked for in the header and in the query parameter ``what`` names, each
    of which must be met. Neither overrides the other: a proxy that forwards the client's
    headers (Traefik's ForwardAuth does by default) while naming its requirement in the
    query must not let the client swap in a weaker one. Either given twice is a 400
    rather than a guess which one counts."""
    param, header = what
    headers = request.headers.getall(header, [])
    # Most calls have no query string: then none is parsed.
    params = request.query.getall(param, []) if request.query_string else []
    if len(headers) > 1 or len(params) > 1:
        raise BadRequest(f"{param}: give it once, in {header} or ?{param}=")
    return [value for value in headers if value] + params  # an empty header is no header


def _required_permissions(request: web.Request) -> list[Query]:
    """Each permission query asked for (``keysvc.domain.permquery``): a name, or names
    joined by AND and OR; given both ways, both must be met."""
    return [permquery.parse(value) for value in _asked(request, _PERMISSION)]


def _required_organizations(request: web.Request) -> list[str]:
    given = _asked(request, _ORGANIZATION)
    for value in given:
        if not UUID_PATTERN.fullmatch(value):
            raise BadRequest(
                "organization: must be an organization ID, a lowercase UUID such as"
                " 123e4567-e89b-42d3-a456-426614174000"
            )
    return given


_COST = ("cost", istr("X-Credit-Cost"))


def _asks_anything(request: web.Request) -> bool:
    """Whether the verify asks for an organization, permissions or a cost: most ask for
    none (no query string, none of their headers), and then nothing is parsed."""
    given = request.headers  # case-insensitive: "in" matches any case
    return bool(request.query_string) or (
        _PERMISSION[1] in given or _ORGANIZATION[1] in given or _COST[1] in given
    )


BAD_COST = f"cost: must be an integer from 0 to {MAX_COST}"


def _cost(request: web.Request) -> int:
    """The credits this request costs: 1 unless ``X-Credit-Cost`` or ``?cost=`` says;
    given both ways, the larger, so that a client's header that a proxy forwards cannot
    lower the cost the proxy names in the query."""
    given = _asked(request, _COST)
    for text in given:
        if not (text.isascii() and text.isdigit() and len(text) <= 7) or int(text) > MAX_COST:
            raise BadRequest(BAD_COST)
    return max((int(text) for text in given), default=1)


# The named limits checked (their names), and their decisions in the same order.
Checked = tuple[Sequence[str], Sequence[Decision]]
_NONE_CHECKED: Checked = ((), ())
# The key's identity as a verify counts its limits: its UUID and its named limits in
# their stored form (``models.Key.ratelimits``'s), None for none.
IdentityLimits = tuple[str | None, str | None]
_NO_IDENTITY: IdentityLimits = (None, None)
_RATELIMIT = istr(namedcount.HEADER)
# What a verify that names no limit asks for: shared, never changed.
_NOTHING_NAMED: Mapping[str, int] = MappingProxyType({})


async def _identity_limits(request: web.Request, caller: Key) -> IdentityLimits:
    """The ID and named limits of the identity of the caller's externalId;
    ``_NO_IDENTITY`` when it has none. Cached: once warm, no statement and no await."""
    assert caller.external_id is not None
    identities = request.app[STORE].identities
    known, found = identities.limits_here(caller.organization_id, caller.external_id)
    if not known:
        found = await identities.limits(caller.organization_id, caller.external_id)
    identity_id, stored = found
    if identity_id is None or not namedcount.limits_of(stored):
        return _NO_IDENTITY
    return identity_id, stored


def _named(request: web.Request, limited: bool) -> Mapping[str, int] | None:
    """The named limits this verify asks for, each with its cost
    (``keysvc.domain.namedcount``); None when neither the key nor its identity has any
    (not ``limited``) and none is named. Nothing named (no X-Ratelimit, no query string)
    costs one header lookup."""
    headers = request.headers
    if _RATELIMIT not in headers and not request.query_string:
        return _NOTHING_NAMED if limited else None
    lines = [line for line in headers.getall(namedcount.HEADER, ()) if line.strip()]
    params = request.query.getall(namedcount.PARAM, []) if request.query_string else []
    named = namedcount.asked(lines, params)
    return named if named or limited else None


def _limits_asked(
    request: web.Request, caller: Key, named: Mapping[str, int], identity: IdentityLimits
) -> namedcount.Asked:
    """What a verify checks of the key's and its identity's (``identity``) autoApply
    limits and those ``named`` (``namedcount.asks``)."""
    identity_id, identity_limits = identity
    if not named:  # most verifies: the autoApply limits, made once per key
        return namedcount.auto_applied(
            caller.id, caller.ratelimits, identity_id, identity_limits, caller.organization_id
        )  # fmt: skip
    # Named in X-Ratelimit (no ?ratelimit=): perhaps by the client, whose header a proxy
    # forwards; it may not lower an autoApply limit's count.
    header = not (request.query_string and namedcount.PARAM in request.query)
    return namedcount.asks(
        caller.id, caller.ratelimits, identity_id, identity_limits, named,
        header=header, organization=caller.organization_id,
    )  # fmt: skip


def _counted_here(request: web.Request, asked: namedcount.Asked) -> bool:
    """Whether ``asked`` all fit and were counted in this process's memory (limits not
    shared), for an answer that shows no limit: then no decision is made, and nothing is
    awaited. False: ask ``_count_named``, which refuses or counts."""
    app = request.app
    return bool(app[LIMITS].counted_here(asked.asks, app[CLOCK]().timestamp()))


async def _count_named(request: web.Request, asked: namedcount.Asked) -> Checked:
    """Check ``asked`` and count it all only if all fit; past one, a 429 with its
    Retry-After and X-RateLimit-* headers. Counted in this process's memory unless the
    limits are shared (PostgreSQL): then nothing is awaited."""
    app = request.app
    now = app[CLOCK]().timestamp()
    limits = app[LIMITS]
    decisions = limits.named_here(asked.asks, now)
    if decisions is None:
        decisions = await limits.named(asked.asks, now)
    return _judged(request, asked, decisions)


def _judged(
    request: web.Request, asked: namedcount.Asked, decisions: Sequence[Decision]
) -> Checked:
    """The limits checked and their decisions; past one, its 429."""
    for name, ask, decision in zip(asked.names, asked.asks, decisions, strict=True):
        if not decision.allowed:
            request[USAGE_REFUSAL] = "rate_limited"
            raise TooManyRequests(
                f"rate limit {name} exceeded for this key: {ask.limit} per {ask.window} s;"
                f" retry in {decision.reset} s",
                retry_after=decision.reset,
                headers=decision.headers,
            )
    return asked.names, decisions


class CreditsExhausted(ApiError):
    """429 without Retry-After: the key has no refill to wait for."""

    status = 429


def _wants_json(request: web.Request) -> bool:
    return "application/json" in request.headers.get(hdrs.ACCEPT, "")


@serves(VERIFY)
async def verify(request: web.Request) -> web.Response:
    caller = request[CALLER]
    organizations: Sequence[str] = ()
    permissions: Sequence[Query] = ()
    cost = 1
    if _asks_anything(request):
        organizations = _required_organizations(request)
        permissions = _required_permissions(request)
        cost = _cost(request)
    external_id = caller.external_id
    identity = _NO_IDENTITY if external_id is None else await _identity_limits(request, caller)
    named = _named(request, caller.ratelimits is not None or identity[1] is not None)
    for organization in organizations:
        authorize_organization(request, organization, "required")
    for needed in permissions:
        authorize_query(request, needed)
    checked = _NONE_CHECKED
    as_json = _wants_json(request)
    if named is not None:
        limits = _limits_asked(request, caller, named, identity)
        # Most answers show no limit: counted, or else refused with the decisions.
        if limits.asks and (as_json or not _counted_here(request, limits)):
            checked = await _count_named(request, limits)
    headers: Mapping[str, str] = render.verify_headers(caller)  # made once per key: read-only
    spent = None
    # The caches say whether the key or its identity has credits; the database, how many.
    if caller.credits is not None or external_id is not None:
        now = request.app[CLOCK]()
        spent = await keycredits.spend(request.app[STORE], caller, cost, now)
        if spent is not None:
            own = dict(headers)
            _spent_headers(request, spent, own, now)
            headers = own
    if not as_json:
        # An identity's limits count every request as the key's own do, and a spend
        # (the key's credits or its identity's) spends on each: never reused.
        reused = identity[1] is None and spent is None
        reuse = reuse_headers(request, 200, caller) if reused else NO_REUSE
        return web.Response(
            status=200, headers=render.verify_answer_headers(caller, reuse, headers)
        )
    headers = {**headers, **NO_REUSE}  # its body depends on Accept, which no cache key covers
    answer = _answer(request, caller, spent, checked)
    owner = await identities.identity_of(request.app[STORE], caller)
    if owner is not None:  # issue 36: who the key is for
        answer["identity"] = {
            "id": owner.id, "externalId": owner.external_id, "meta": owner.meta
        }  # fmt: skip
    response = json_response(envelope(request[REQUEST_ID], render.encode(answer)))
    response.headers.update(headers)
    return response


def _spent_headers(
    request: web.Request, spent: Spent, headers: dict[str, str], now: datetime
) -> None:
    """Refuse a spend that either owner refused (the key's first), else say what each
    owner has left: X-Credits-Remaining (the key's), X-Credits-Identity-Remaining."""
    for owner, exhausted in ((spent.key, rules.EXHAUSTED), (spent.identity, IDENTITY_EXHAUSTED)):
        if owner is not None and not owner.allowed:
            _refuse(request, owner.credits, now, exhausted)
    if spent.key is not None:
        headers["X-Credits-Remaining"] = str(spent.key.credits.remaining)
    if spent.identity is not None:
        headers["X-Credits-Identity-Remaining"] = str(spent.identity.credits.remaining)
        headers.update(NO_REUSE)  # each request spends: a proxy must ask every time


IDENTITY_EXHAUSTED = "credits exhausted for this key's identity"


def _refuse(
    request: web.Request, credits: Credits, now: datetime, exhausted: str = rules.EXHAUSTED
) -> NoReturn:
    """429 for a key (or its identity: ``exhausted`` says which) without the credits this
    request costs; Retry-After: the seconds until its next refill, when it has one. No
    proxy may reuse it: ``auth.guarded`` says so on every verify refusal
    (``keysvc.http.reuse``)."""
    request[USAGE_REFUSAL] = "credits_exhausted"
    wait = rules.seconds_to_refill(credits, now)
    message = f"{exhausted}: {credits.remaining} remaining"
    if wait is None:
        raise CreditsExhausted(message + "; no refill is due")
    raise TooManyRequests(message + f"; next refill in {wait} s", retry_after=wait)


def _answer(
    request: web.Request, caller: Key, spent: Spent | None, checked: Checked
) -> dict[str, Any]:
    """Verify's JSON answer: who is calling, what it may do, and its standing."""
    answer: dict[str, Any] = {
        "keyId": caller.id,
        "organizationId": caller.organization_id,
        "name": caller.name,
        "externalId": caller.external_id,
        "meta": caller.meta,
        "permissions": sorted(caller.permissions),
    }
    if spent is not None and spent.key is not None:
        answer["credits"] = {"remaining": spent.key.credits.remaining}
    if spent is not None and spent.identity is not None:
        answer["identityCredits"] = {"remaining": spent.identity.credits.remaining}
    decision = request.get(RATE_DECISION)
    if decision is not None:
        answer["ratelimit"] = {
            "limit": decision.limit,
            "remaining": decision.remaining,
            "reset": decision.reset,
        }
    if checked[0]:
        answer["ratelimits"] = [
            {
                "name": name,
                "limit": decision.limit,
                "remaining": decision.remaining,
                "reset": decision.reset,
                "exceeded": not decision.allowed,
            }
            for name, decision in zip(*checked, strict=True)
        ]
    return answer
