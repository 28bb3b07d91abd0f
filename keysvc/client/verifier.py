"""The check both middlewares run (``keysvc.client.middleware_aiohttp``,
``keysvc.client.middleware_asgi``): a request's credentials to keysvc's ``/v1/verify``,
its answer kept only as keysvc's reuse headers allow (``keysvc.client.reuse``), and a
refusal turned into the answer the service gives its own client.

The rules: a request without an Authorization header, or with several, is refused as
keysvc refuses it (401), without asking keysvc; the caller's one header is forwarded as
it came, in a POST; besides it the
verify request carries only what the service sets (the route's permission, the
organization, and the client address when ``forward_client_address`` says keysvc trusts
this service), never a header of the client's. A 200 is kept, keyed by a digest of all
four, for as long as keysvc says (not at all for a key with credits or a request limit,
nor for a JSON answer); a refusal is never kept. While one question is on its way, the
same question waits for its answer rather than asking again, and takes it only if it may
be kept. keysvc's 401, 403 and 429 reach the
client with keysvc's status, message, requestId and Retry-After; anything else (keysvc
unreachable, a 5xx, a 400 of a misconfigured requirement) is a 503 with Retry-After:
the service fails closed."""

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from yarl import URL

import keysvc.client.calls as calls
from keysvc.client.aio import AsyncClient
from keysvc.client.errors import KeysvcError
from keysvc.client.records import Caller
from keysvc.client.reuse import ReuseStore, digest, reuse_seconds
from keysvc.client.wire import Answer, Call, outcome

PASSED_ON = frozenset({401, 403, 429})
MAX_QUESTIONS = 256  # verify questions kept built, one per permission asked for


@dataclass(frozen=True)
class Refusal:
    """What the service answers a refused request: status, JSON body, headers."""

    status: int
    body: bytes
    headers: dict[str, str]


# keysvc's own 401s for a request without credentials and for one with several.
MISSING = "invalid credentials: send Authorization: Basic base64(keyId:keySecret)"
SEVERAL = "invalid credentials: send one Authorization header, not {}"


def refusal(error: KeysvcError, retry_after: int) -> Refusal:
    """keysvc's refusal as it came, or a 503 for anything that is not one."""
    if error.status in PASSED_ON:
        return refused(error.status, error.message, error.request_id, error.retry_after)
    message = "keysvc unavailable: try again later"
    return refused(503, message, None, error.retry_after or retry_after)


def refused(status: int, message: str, request_id: str | None, wait: int | None) -> Refusal:
    """The refusal's envelope, with a fresh requestId when keysvc gave none."""
    body = {"status": status, "error": message, "requestId": request_id or str(uuid.uuid4())}
    headers = {"Content-Type": "application/json", "Cache-Control": "no-store"}
    if wait is not None:
        headers["Retry-After"] = str(wait)
    return Refusal(status, json.dumps(body).encode(), headers)


def authorization(values: Sequence[str]) -> str | Refusal:
    """A request's one Authorization header (of ``values``, every one it sent), or the
    401 keysvc answers a request with none or with several, given without asking it: a
    request without credentials never reaches keysvc, where a session's own default
    could stand in for them."""
    if len(values) > 1:
        return refused(401, SEVERAL.format(len(values)), None, None)
    if not values or not values[0]:
        return refused(401, MISSING, None, None)
    return values[0]


def _read(answer: Answer) -> tuple[Caller, float]:
    return calls.read_caller(answer), reuse_seconds(answer.headers, time.time())


class Verifier:
    """Checks requests with keysvc at ``url``. ``organization``: the organization every
    key must belong to; ``full``: ask for the JSON answer (name and meta), which keysvc
    never lets be reused; ``max_entries``: the bound on kept answers (0: keep none);
    ``retry_after``: the seconds a 503 tells clients to wait."""

    def __init__(
        self,
        url: str,
        *,
        organization: str | None = None,
        forward_client_address: bool = False,
        full: bool = False,
        max_entries: int = 10_000,
        timeout: float = 5.0,
        retry_after: int = 1,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if session is not None and session.auth is not None:
            # aiohttp would add it to a request without credentials, and refuse to
            # send a caller's header beside it.
            raise ValueError("a Verifier's session may carry no credentials of its own")
        self.client = AsyncClient(url, timeout=timeout, session=session)
        address = self.client.base_url + "/v1/verify"
        try:
            self._url: URL | str = URL(address)
        except ValueError:  # aiohttp refuses it on each request: a 503, as keysvc unreachable
            self._url = address
        # Verify's question by permission, built once: a miss adds only the caller's
        # header (and its address) to the question's own.
        self._questions: dict[str | None, Call[tuple[Caller, float]]] = {}
        self.organization = organization
        self.forward_client_address = forward_client_address
        self.full = full
        self.retry_after = retry_after
        self.kept: ReuseStore[Caller] = ReuseStore(max_entries)
        # Questions on their way to keysvc, by digest: the same one asked meanwhile
        # waits for the answer and takes it if it may be kept (a key with credits is
        # asked again: each request spends).
        self._flights: dict[bytes, asyncio.Event] = {}

    async def close(self) -> None:
        await self.client.close()

    def reused(
        self, authorizations: Sequence[str], permission: str | None, client_address: str | None
    ) -> Caller | None:
        """The kept answer to this question (``check``'s arguments), or None: then
        ``check`` answers it. The hit path, with no coroutine of its own, so that a
        middleware awaits only when keysvc must be asked."""
        if len(authorizations) != 1:
            return None
        if not self.forward_client_address:
            client_address = None
        key = digest(authorizations[0], permission, self.organization, client_address)
        return self.kept.get(key, time.monotonic())

    async def check(
        self, authorizations: Sequence[str], permission: str | None, client_address: str | None
    ) -> Caller | Refusal:
        """The caller of a request with the Authorization headers ``authorizations`` that
        needs ``permission`` (None: any key of the organization), or the refusal to
        answer it with."""
        found = authorization(authorizations)
        if isinstance(found, Refusal):
            return found
        return await self._check(found, permission, client_address)

    async def _check(
        self, authorization: str, permission: str | None, client_address: str | None
    ) -> Caller | Refusal:
        if not self.forward_client_address:
            client_address = None
        key = digest(authorization, permission, self.organization, client_address)
        kept = self.kept.get(key, time.monotonic())
        if kept is not None:
            return kept
        flight = self._flights.get(key)
        if flight is not None:  # the same question is on its way: its answer, if kept
            await flight.wait()
            kept = self.kept.get(key, time.monotonic())
            if kept is not None:
                return kept
            return await self._ask(key, authorization, permission, client_address)
        flight = self._flights[key] = asyncio.Event()
        try:
            return await self._ask(key, authorization, permission, client_address)
        finally:
            del self._flights[key]
            flight.set()

    async def _ask(
        self,
        key: bytes,
        authorization: str,
        permission: str | None,
        client_address: str | None,
    ) -> Caller | Refusal:
        """keysvc's answer, kept when it says so."""
        question = self._question(permission)
        headers = question.request_headers(authorization)
        if client_address is not None:
            headers["X-Forwarded-For"] = client_address
        asked = time.monotonic()
        try:  # the caller's header, always there: it replaces any default of the session
            answer = await self.client.exchange(question.method, self._url, headers)
            caller, seconds = outcome(question, answer)
        except KeysvcError as refused:
            return refusal(refused, self.retry_after)
        if seconds > 0:
            self.kept.put(key, caller, asked + seconds)
        return caller

    def _question(self, permission: str | None) -> Call[tuple[Caller, float]]:
        """Verify's question for ``permission``, without the caller's header and address.
        POST: spent credits are not spent again by a proxy or aiohttp asking again after
        a lost answer, as they may be for a GET (keysvc answers verify on any method)."""
        question = self._questions.get(permission)
        if question is None:
            if len(self._questions) >= MAX_QUESTIONS:  # permissions named per request
                self._questions.clear()
            headers = calls.verify_headers(
                permission=permission, organization=self.organization, full=self.full
            )
            question = Call("POST", "/v1/verify", _read, headers=headers)
            self._questions[permission] = question
        return question
