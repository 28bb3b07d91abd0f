"""Authentication (who is calling) and authorization (may they do this), once each per
request, in ``guarded``, before any view.

Missing, malformed, unknown and wrong credentials fail alike: one message and the
same work, so a key ID's existence never shows. Only a proven secret learns that its
key is disabled, expired or outside its IP access list,
or that it is a rotated key's previous pair past its grace (refused as "rotated", never
counted as a failed login). Each outcome is recorded on
the request (``AUTH_OUTCOME``) for the access log and metrics, and an admitted key's
request counts once in its usage. The client address is the TCP peer, or, behind a
trusted proxy or the unix socket, read from ``X-Forwarded-For``. The rules and their
reasons: docs/SECURITY.md, "How a request is authenticated".
"""

import base64
import binascii
import functools
import hashlib
import hmac
import re
import time
from collections.abc import Sequence
from datetime import datetime
from typing import NoReturn

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from keysvc.config import IPNetwork
from keysvc.credentials import Hasher, checksum_fails, sha256_b64
from keysvc.db.contract import RevokedUse, Store
from keysvc.db.usage import COUNTED
from keysvc.domain.activities import DELETED, api_actor, key_used_after_revoke
from keysvc.domain.addresses import IPAddress, network_of, parse_address, within
from keysvc.domain.permissions import has_permission
from keysvc.domain.permquery import Query
from keysvc.domain.ratelimit import Decision, Limits
from keysvc.errors import (
    ApiError,
    BearerUnauthorized,
    Forbidden,
    TooManyRequests,
    Unauthorized,
)
from keysvc.http.reuse import reuse_headers
from keysvc.http.routes import VERIFY, path_uuid, route_of
from keysvc.http.state import (
    AUTH_OUTCOME,
    CALLER,
    CLIENT_ADDRESS,
    CLOCK,
    HASHER,
    LIMITS,
    METRICS,
    PREVIOUS_CREDENTIAL,
    PROVEN,
    RATE_DECISION,
    SETTINGS,
    STORE,
    USAGE_REFUSAL,
)
from keysvc.keyview import api_key
from keysvc.metrics import AuthReason
from keysvc.models import Credential, Key
from keysvc.timeutil import to_minute

# Compared against when the key ID is unknown, so both failures do the same work.
_ABSENT = bytes(32)
# Longest Authorization header read: room for a key ID and secret of your own
# (hashData) of a thousand characters or more each.
MAX_AUTHORIZATION = 4096
# The usage outcome (its index in COUNTED) of each reason a request of a known key ends with.
_USAGE_OUTCOME: dict[str, int] = {
    reason: COUNTED.index(outcome)
    for reason, outcome in (
        ("ok", "success"),
        ("disabled", "disabled"),
        ("expired", "expired"),
        ("ip", "ip_denied"),
        ("permission", "forbidden"),
        ("rate_limited", "rate_limited"),
        ("credits_exhausted", "credits_exhausted"),
    )
}
# The answer to a rotated key's replaced key ID and secret, their grace over.
ROTATED = "key is rotated: use its new credentials"
# The store-timing operation every credential check is observed as (keysvc.metrics).
CHECK_CREDENTIALS = "check_credentials"


def parse_basic(header: str | None) -> tuple[str, str] | None:
    """(key ID, secret) from ``Basic base64(id:secret)``, or None if it is not that."""
    if not header:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded or " " in encoded.strip():
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    key_id, colon, secret = decoded.partition(":")
    if not colon or not key_id or not secret:
        return None
    return key_id, secret


def parse_bearer(header: str | None) -> str | None:
    """The token of ``Bearer <token>``, or None if it is not that: one token of
    printable ASCII, no blank inside (RFC 6750's token68, and what services issue)."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or not token.isascii() or not token.isprintable():
        return None
    return None if " " in token else token


def credential_hashes(header: str | None, hasher: Hasher) -> tuple[bytes, bytes] | None:
    """The keyed hashes a header's credentials are found and checked by: (the key-ID
    hash, the secret's keyed hash). Basic: of its key ID and secret, None when the secret
    claims keysvc's format with a wrong checksum. Bearer (an imported token's key): its
    lookup hash (``Hasher.token_lookup``) and its own keyed hash. None for anything else."""
    token = parse_bearer(header)
    if token is not None:
        digest = sha256_b64(token)
        return hasher.token_lookup(digest), hasher.keyed(digest)
    credentials = parse_basic(header)
    if credentials is None or checksum_fails(credentials[1], hasher.secret_prefix):
        return None
    return hasher.of_plain(credentials[0]), hasher.of_plain(credentials[1])


def _authorization(request: web.Request) -> str | None:
    """The one Authorization header. Two are ambiguous (a proxy may forward either),
    and a header longer than any Basic credentials keysvc accepts is refused
    before it is decoded; each is a 401 that says so."""
    values = request.headers.getall(hdrs.AUTHORIZATION, [])
    if len(values) > 1:
        _outcome(request, "malformed")
        raise Unauthorized(f"invalid credentials: send one Authorization header, not {len(values)}")
    if values and len(values[0]) > MAX_AUTHORIZATION:
        _outcome(request, "malformed")
        raise Unauthorized(
            f"invalid credentials: the Authorization header is over {MAX_AUTHORIZATION} characters"
        )
    return values[0] if values else None


def _outcome(request: web.Request, reason: AuthReason) -> None:
    request[AUTH_OUTCOME] = reason


async def _check_credentials(
    request: web.Request,
    header: str | None,
    hasher: Hasher,
    store: Store,
    address: IPAddress | None,
    moment: datetime,
) -> tuple[bytes, Credential]:
    """The key-ID hash and credential of the key whose ID and secret ``header`` carries,
    or whose bearer token it carries (``credential_hashes``): the token's lookup hash
    finds it, and its secret hash is compared as a secret's is.

    A rotated key's replaced key ID (``Credential.replaced_at``: a previous key ID past
    its end, or its tombstone) with its own secret is refused as rotated, uncounted;
    with any other secret, as an unknown key ID is, after the same work.

    Checks from one network run only while those already under way, should they all
    fail, would stay within the failed-login limit (``Limits.begin_check``); others
    wait for them, and are refused if they used it up. Checked before the first wait
    only, every guess sent at once would pass the limit together.
    """
    hashes = credential_hashes(header, hasher)
    if hashes is None:
        _outcome(request, "malformed")
        raise Unauthorized()
    key_id_hash, offered = hashes
    metrics = request.app.get(METRICS)
    limits = request.app[LIMITS]
    now = moment.timestamp()
    network = await limits.begin_check(address, request.app[SETTINGS].auth_failures, now)
    if network is None:
        _refuse_address(request, limits, now)
    started = time.perf_counter()
    try:
        found = cached = store.cached_credential(key_id_hash)
        if found is None:
            found = await store.find_credential(key_id_hash, offered)
        # A previous secret hash cleared by hand (docs/SECURITY.md) is no hash at all.
        expected = (found.secret_hash if found is not None else None) or _ABSENT
        matched = hmac.compare_digest(offered, expected)
        if matched and found is not None and found.replaced_at(moment):
            # Not a guess: its holder is told, and not counted toward the throttle.
            _outcome(request, "rotated")
            raise Unauthorized(ROTATED)
        live = found if found is not None and found.usable_at(moment) else None
        if not matched or live is None or live.deleted:
            # The answer, the recorded reason and the work done are the same, database
            # read included: a cached key runs the read an uncached one made.
            _outcome(request, "invalid_credentials")
            if cached is not None:
                await store.read_as_uncached(key_id_hash)
            # Counted before this check leaves the ones under way: a check waiting for
            # room must see it.
            limits.failed(address, now)
            if matched and live is not None:
                # A deleted key's own secret: refused as unknown, and logged off this
                # request's path, as a disabled key's use is.
                _note_revoked_use(request, store, live.key, address, moment)
            raise Unauthorized()
    finally:
        # One observation per check, cached or not, found or not: a count of store
        # reads would tell a scraper which key IDs exist (unknown ones are never cached).
        if metrics is not None:
            metrics.observe_db(CHECK_CREDENTIALS, time.perf_counter() - started)
        limits.end_check(network)
    return key_id_hash, live


async def authenticate(request: web.Request, address: "IPAddress | None", now: datetime) -> Key:
    """The enabled, unexpired key whose credentials the request carries, allowed
    from ``address`` (the client address, see ``client_address``) at ``now``.

    A header whose credentials were checked before, against a key still cached
    with the same secret hash, is known by its keyed hash alone (``Store.proven_credential``);
    any other is parsed, and its key ID and secret hashed and compared.
    """
    header = _authorization(request)
    app = request.app
    hasher, store = app[HASHER], app[STORE]
    proof = hasher.of_header(header) if header else None
    found = store.proven_credential(proof) if proof is not None else None
    if found is None or not found.usable_at(now):
        # A proven previous credential past its end is checked in full, and so refused
        # as an unknown key ID is, by the same path.
        key_id_hash, found = await _check_credentials(request, header, hasher, store, address, now)
        if proof is not None:
            store.remember_proof(proof, key_id_hash, found)
    if found.until is not None:
        request[PREVIOUS_CREDENTIAL] = True
    key = found.key
    minute = to_minute(now)
    request[PROVEN] = (key.id, minute)
    if key.state != "enabled":
        _outcome(request, "disabled")
        _note_revoked_use(request, store, key, address, now)
        raise Unauthorized("key is disabled")
    if key.expire_at is not None and key.expire_at <= now:
        _outcome(request, "expired")
        raise Unauthorized("key has expired")
    if key.ip_access_list and not address_allowed(address, key.ip_access_list):
        _outcome(request, "ip")
        raise Forbidden("client address not allowed for this key")
    request[AUTH_OUTCOME] = "ok"
    if store.needs_touch(key, minute):
        await store.touch_used(key.id, minute)
    return key


def _note_revoked_use(
    request: web.Request, store: Store, key: Key, address: IPAddress | None, now: datetime
) -> None:
    """Log that the credentials of a disabled or deleted key were used, by that key,
    and send the ``key.used_after_revoke`` event, at most once a minute per key and
    off this request's path (``Store.note_revoked_use``). A deleted key's event
    carries only its UUID and the state ``deleted``: nothing else of it is kept."""

    def use() -> RevokedUse:
        actor = api_actor(key, address, request.headers.get(hdrs.USER_AGENT))
        view = {"id": key.id, "state": key.state} if key.state == DELETED else api_key(key)
        return RevokedUse(key_used_after_revoke(key, actor, now), view)

    store.note_revoked_use(key.id, now, use)


# The peer's text comes from the socket, and a few peers (proxies) make most requests;
# X-Forwarded-For hops come from clients, and are parsed each time, never kept.
_peer_address = functools.lru_cache(maxsize=1024)(parse_address)
# A hop with a port, or in brackets: the address is the first group, the port the second.
_BRACKETED_HOP = re.compile(r"\[([0-9A-Fa-f.]*:[0-9A-Fa-f:.]*)\](?::([0-9]{1,5}))?")
_V4_HOP_WITH_PORT = re.compile(r"([0-9.]+):([0-9]{1,5})")


def _hop(text: str) -> IPAddress | None:
    """The address of one X-Forwarded-For hop: an address, ``a.b.c.d:port``, ``[v6]``
    or ``[v6]:port``; None for anything else. An IPv6 address with a port needs its
    brackets: unbracketed, its last group is read as part of the address."""
    hop = text.strip()
    match = _BRACKETED_HOP.fullmatch(hop) or _V4_HOP_WITH_PORT.fullmatch(hop)
    if match is None:
        return parse_address(hop)
    address, port = match.groups()
    if port is not None and int(port) > 65535:
        return None
    return parse_address(address)


def client_address(
    peer: str | None,
    forwarded_for: str | None,
    trusted: Sequence[IPNetwork],
    from_proxy: bool = False,
) -> IPAddress | None:
    """The client's address: the peer, or behind trusted proxies the first untrusted hop.
    ``from_proxy``: the peer is the proxy, whatever its address (the unix socket's);
    with no X-Forwarded-For from it, the client's address is unknown (None)."""
    address = None if from_proxy else _peer_address(peer)
    if not forwarded_for or not (from_proxy or (address is not None and within(address, trusted))):
        return address
    for hop in reversed(forwarded_for.split(",")):
        parsed = _hop(hop)
        if parsed is None:
            break  # a malformed hop: trust stops at the last proxy we know
        address = parsed
        if not within(address, trusted):
            break
    return address


def address_allowed(address: IPAddress | None, access_list: Sequence[dict[str, str]]) -> bool:
    if address is None:
        return False
    networks = [network_of(entry["source"]) for entry in access_list]
    return within(address, networks)


def check_bearer(request: web.Request, token: str | None) -> None:
    """Let the request through if ``token`` is None or it sends one Authorization
    header, ``Bearer <token>``; else 401. The token is compared as SHA-256 digests,
    in constant time: their equal length says nothing of the token's."""
    if token is None:
        return
    values = request.headers.getall(hdrs.AUTHORIZATION, [])
    scheme, _, offered = values[0].partition(" ") if len(values) == 1 else ("", "", "")
    given = hashlib.sha256(offered.strip().encode("utf-8", "surrogatepass")).digest()
    wanted = hashlib.sha256(token.encode()).digest()
    if not hmac.compare_digest(given, wanted) or scheme.lower() != "bearer":
        raise BearerUnauthorized()


def authorize(request: web.Request, organization_id: str, permission: str) -> Key:
    """The caller, if its key belongs to ``organization_id`` and holds ``permission``."""
    authorize_organization(request, organization_id, "in the path")
    return authorize_permission(request, permission)


def authorize_organization(request: web.Request, organization_id: str, which: str) -> Key:
    """The caller, if its key belongs to ``organization_id``; ``which`` says where that
    organization was named, in the refusal."""
    caller = request[CALLER]
    if caller.organization_id != organization_id:
        _outcome(request, "permission")
        raise Forbidden(f"this key does not belong to the organization {which}")
    return caller


def authorize_query(request: web.Request, query: Query) -> Key:
    """The caller, if its permissions meet ``query`` (``keysvc.domain.permquery``); a
    query of one name is refused as ``authorize_permission`` refuses it."""
    if query.op == "name":
        return authorize_permission(request, query.name)
    caller = request[CALLER]
    if not query.met_by(caller.permissions):
        _outcome(request, "permission")
        raise Forbidden(f"this key does not meet the permission query {query.text()}")
    return caller


def authorize_permission(request: web.Request, permission: str) -> Key:
    """The caller, if it holds ``permission`` (wildcards apply)."""
    caller = request[CALLER]
    if not has_permission(caller.permissions, permission):
        _outcome(request, "permission")
        raise Forbidden(f"this key lacks the permission {permission}")
    return caller


def _over_unix(request: web.Request) -> bool:
    """Whether the request came in on keysvc's unix socket, whose name is a path where
    a TCP socket's is an (address, port) pair."""
    transport = request.transport
    return transport is not None and isinstance(transport.get_extra_info("sockname"), str)


def _refuse_address(request: web.Request, limits: Limits, now: float) -> NoReturn:
    retry = limits.failures.retry_after(now)
    _outcome(request, "rate_limited")
    raise TooManyRequests(
        f"too many failed authentications from this address: retry in {retry} s",
        retry_after=retry,
    )


def _peer(peer: str | None) -> tuple[IPAddress | None, str | None]:
    """The peer's address and its text, for a request without X-Forwarded-For."""
    address = parse_address(peer)  # kept by the cache below, as _peer_address keeps it
    return address, None if address is None else str(address)


# As _peer_address: a few peers make most requests, and str() of an address costs more
# than the rest of finding it.
_peer_and_text = functools.lru_cache(maxsize=1024)(_peer)


def request_address(request: web.Request) -> IPAddress | None:
    """The client address of ``request`` (``client_address``), as keysvc believes it."""
    return _request_address(request, request.app[SETTINGS].trusted_proxies)[0]


def _request_address(
    request: web.Request, trusted: Sequence[IPNetwork]
) -> tuple[IPAddress | None, str | None]:
    """``request_address`` and its text (``CLIENT_ADDRESS``'s)."""
    forwarded = request.headers.get(hdrs.X_FORWARDED_FOR)
    if forwarded is None:
        # Without a forwarded header a unix peer has no address either way (its
        # peername is empty): the peer alone decides.
        return _peer_and_text(request.remote)
    # One list, in order, however many lines carry it: a proxy that appends its own
    # line must not leave the client's first line to be read as the last hop.
    forwarded = ", ".join(request.headers.getall(hdrs.X_FORWARDED_FOR))
    from_proxy = _over_unix(request)
    address = client_address(request.remote, forwarded, trusted, from_proxy)
    return address, None if address is None else str(address)


async def throttled_address(request: web.Request) -> IPAddress | None:
    """The client address of a public request that proves nothing of its sender, once
    its network is found under the failed-login limit (KEYSVC_AUTH_FAILURES a minute):
    else it is refused with 429, as a login from there would be."""
    app = request.app
    settings, limits = app[SETTINGS], app[LIMITS]
    now = app[CLOCK]().timestamp()
    address = request_address(request)
    if not await limits.failures_allow(address, settings.auth_failures, now):
        _refuse_address(request, limits, now)
    request[CLIENT_ADDRESS] = None if address is None else str(address)
    return address


async def admit_unproven(request: web.Request) -> IPAddress | None:
    """Admit a report of a leaked secret as a failed login is throttled
    (``throttled_address``), and count it as a failed login whatever it turns out to be,
    so that neither the answer nor the throttle tells what it found. Its client address."""
    address = await throttled_address(request)
    request.app[LIMITS].failed(address, request.app[CLOCK]().timestamp())
    return address


async def _admit(request: web.Request, app: web.Application) -> tuple[Key, Decision | None]:
    """Authenticate within the limits: failed logins per network, then requests per
    key. The caller's key, and its standing against its request limit if it has one."""
    settings, limits = app[SETTINGS], app[LIMITS]
    moment = app[CLOCK]()
    now = moment.timestamp()
    address, text = _request_address(request, settings.trusted_proxies)
    # Checked before the credentials, so a blocked address is refused even with valid ones.
    allowed = limits.failures_allow_here(address, settings.auth_failures, now)
    if allowed is None:
        allowed = await limits.failures_allow(address, settings.auth_failures, now)
    if not allowed:
        _refuse_address(request, limits, now)
    request[CLIENT_ADDRESS] = text
    try:
        key = await authenticate(request, address, moment)
    except Unauthorized:
        # Wrong credentials were counted where they were checked (_check_credentials).
        if request.get(AUTH_OUTCOME) == "malformed":
            limits.failed(address, now)
        raise
    limit = key.rate_limit or settings.rate_limit
    if limit is None:
        return key, None
    decision = await limits.request(key.id, limit[0], limit[1], now, key.organization_id)
    if not decision.allowed:
        _outcome(request, "rate_limited")
        raise TooManyRequests(
            f"rate limit exceeded for this key: {limit[0]} requests per {limit[1]} s;"
            f" retry in {decision.reset} s",
            retry_after=decision.reset,
            headers=decision.headers,
        )
    return key, decision


async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``handler``'s answer, for an admitted caller (``request[CALLER]``) unless the
    route is declared public (``keysvc.http.routes``), authorized for the route's
    permission in the organization its path names before the handler runs; the caller's
    request-limit standing goes on the answer. A request of a known key counts in its
    usage once, under the outcome it ended with."""
    match = request.match_info
    if match.http_exception is not None:
        return await handler(request)
    route = route_of(match.handler)
    if route is not None and route.public:
        return await handler(request)
    refused = raised = False
    app = request.app
    try:
        request[CALLER], decision = await _admit(request, app)
        if decision is not None:
            request[RATE_DECISION] = decision
        if route is not None and route.permission is not None:
            authorize(request, path_uuid(request, "organizationId"), route.permission)
        response = await handler(request)
    except ApiError as exc:
        refused, raised = exc.status == Forbidden.status, True
        if route is VERIFY:  # how long the proxy may reuse the refusal (keysvc.http.reuse)
            exc.headers.update(reuse_headers(request, exc.status))
        raise
    except BaseException:
        raised = True
        raise
    finally:
        _count_use(request, app, refused, raised)
    if decision is not None:
        response.headers.update(decision.headers)
    return response


def _count_use(request: web.Request, app: web.Application, refused: bool, raised: bool) -> None:
    """Count the request in its key's usage, if its secret was proven; ``refused``: its
    answer is a 403, ``forbidden`` for an admitted key whatever raised it; ``raised``:
    the handling raised. A view's own refusal (``USAGE_REFUSAL``) is raised, so an
    answer returned is counted by its authentication alone, without asking the request
    for a key it lacks (a miss raises and catches KeyError in Python)."""
    proven = request.get(PROVEN)
    if proven is not None:
        reason: str = request[AUTH_OUTCOME]
        given = request.get(USAGE_REFUSAL) if raised else None
        reason = given or ("permission" if refused and reason == "ok" else reason)
        outcome = _USAGE_OUTCOME.get(reason)
        if outcome is not None:
            app[STORE].count_use(proven[0], proven[1], outcome)
