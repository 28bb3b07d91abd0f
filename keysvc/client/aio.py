"""The async client, on aiohttp (keysvc's own HTTP library, so no new dependency): one
``ClientSession`` with its connection pool per client, closed by ``async with`` or
``close()``. Each method is one call of ``keysvc.client.calls``; refusals raise
``keysvc.client.errors.KeysvcError``, and keysvc unreachable raises ``Unavailable``."""

from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack

import aiohttp
from yarl import URL

import keysvc.client.calls as calls
from keysvc.client.auth import basic_authorization
from keysvc.client.errors import Unavailable
from keysvc.client.records import Caller, JsonObject, Page, Tagged
from keysvc.client.wire import Answer, Call, outcome

T = TypeVar("T")


class AsyncClient:
    """keysvc at ``base_url``, called with a key's ``key_id`` and ``key_secret`` (or a
    whole ``authorization`` header); ``verify`` forwards its caller's header instead."""

    def __init__(
        self,
        base_url: str,
        key_id: str | None = None,
        key_secret: str | None = None,
        *,
        authorization: str | None = None,
        timeout: float = 10.0,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.authorization = basic_authorization(key_id, key_secret, authorization)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    async def send(self, call: Call[T], authorization: str | None = None) -> T:
        """Run ``call`` with ``authorization`` (None: the client's own; "": none)."""
        headers = call.request_headers(
            self.authorization if authorization is None else authorization
        )
        answer = await self.exchange(
            call.method, self.base_url + call.target(), headers, call.payload()
        )
        return outcome(call, answer)

    async def exchange(
        self, method: str, url: str | URL, headers: Mapping[str, str], body: bytes | None = None
    ) -> Answer:
        """One request to keysvc (``url``, absolute) and its answer as it came, whatever
        its status; ``Unavailable`` when keysvc is unreachable or does not answer in time.
        ``send`` runs every call through it; ``Verifier`` calls it with a URL and headers
        built once, as a miss runs it on a service's request path."""
        session = self._session
        if session is None:
            session = self._session = aiohttp.ClientSession(timeout=self._timeout)
            self._owns_session = True
        try:
            async with session.request(method, url, data=body, headers=headers) as response:
                return Answer(response.status, response.headers, await response.read())
        except (TimeoutError, aiohttp.ClientError, OSError) as failed:
            raise Unavailable(503, f"keysvc unreachable: {failed!r}") from failed

    async def list_keys(
        self, organization_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page:
        return await self.send(calls.list_keys(organization_id, limit, cursor))

    async def iter_keys(self, organization_id: str, *, limit: int = 100) -> AsyncIterator[Any]:
        """Every key of the organization, page after page (oldest first)."""
        cursor = None
        while True:
            page = await self.list_keys(organization_id, limit=limit, cursor=cursor)
            for key in page.items:
                yield key
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def create_key(self, organization_id: str, body: JsonObject) -> JsonObject:
        """The new key and its credentials (``key``, ``keyId``, ``keySecret``), shown once."""
        return await self.send(calls.create_key(organization_id, body))

    async def get_key(self, organization_id: str, key_id: str) -> Tagged:
        return await self.send(calls.get_key(organization_id, key_id))

    async def update_key(
        self, organization_id: str, key_id: str, changes: JsonObject, *, if_match: str | None = None
    ) -> Tagged:
        """PATCH the key; with ``if_match`` (an ETag), a 412 ``Conflict`` if it changed since."""
        return await self.send(calls.update_key(organization_id, key_id, changes, if_match))

    async def delete_key(
        self, organization_id: str, key_id: str, *, if_match: str | None = None
    ) -> None:
        await self.send(calls.delete_key(organization_id, key_id, if_match))

    async def rotate_key(
        self, organization_id: str, key_id: str, body: JsonObject | None = None
    ) -> JsonObject:
        return await self.send(calls.rotate_key(organization_id, key_id, body))

    async def change_credits(self, organization_id: str, key_id: str, change: JsonObject) -> Tagged:
        """One of ``{"set": n}``, ``{"increment": n}``, ``{"decrement": n}``."""
        return await self.send(calls.change_credits(organization_id, key_id, change))

    async def key_usage(
        self, organization_id: str, key_id: str, query: Mapping[str, str] | None = None
    ) -> JsonObject:
        return await self.send(calls.key_usage(organization_id, key_id, query or {}))

    async def list_roles(
        self, organization_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page:
        return await self.send(calls.list_roles(organization_id, limit, cursor))

    async def create_role(self, organization_id: str, body: JsonObject) -> JsonObject:
        return await self.send(calls.create_role(organization_id, body))

    async def get_role(self, organization_id: str, role_id: str) -> JsonObject:
        return await self.send(calls.get_role(organization_id, role_id))

    async def update_role(
        self, organization_id: str, role_id: str, changes: JsonObject
    ) -> JsonObject:
        return await self.send(calls.update_role(organization_id, role_id, changes))

    async def delete_role(self, organization_id: str, role_id: str) -> None:
        await self.send(calls.delete_role(organization_id, role_id))

    async def whoami(self) -> JsonObject:
        return await self.send(calls.whoami())

    async def verify(self, authorization: str, **asked: Unpack[calls.Requirements]) -> Caller:
        """Who ``authorization`` (a caller's header, as it came) is, if keysvc admits it
        with what is ``asked`` (``calls.Requirements``: permission, organization, cost,
        forwarded_for, full)."""
        return await self.send(calls.verify(**asked), authorization)
