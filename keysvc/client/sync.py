"""The sync client, on the standard library's ``http.client``: the same calls as
``keysvc.client.aio.AsyncClient``, for code without an event loop, with no dependency
at all. One kept-alive connection per client, used by one thread at a time (a lock);
a connection keysvc closed while idle is opened again once for a GET or HEAD; any other
call keysvc may have acted on raises ``Unavailable`` rather than being sent twice."""

import http.client
import threading
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack
from urllib.parse import urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

import keysvc.client.calls as calls
from keysvc.client.auth import basic_authorization
from keysvc.client.errors import Unavailable
from keysvc.client.records import Caller, JsonObject, Page, Tagged
from keysvc.client.wire import Answer, Call, outcome

T = TypeVar("T")
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
# What may be sent again after a kept-alive connection failed: keysvc may have acted on
# the request before its answer was lost, so only reads (verify, a POST, spends credits).
_SAFE_AGAIN = frozenset({"GET", "HEAD"})


class Client:
    """keysvc at ``base_url`` (http or https), called with a key's ``key_id`` and
    ``key_secret`` (or a whole ``authorization`` header)."""

    def __init__(
        self,
        base_url: str,
        key_id: str | None = None,
        key_secret: str | None = None,
        *,
        authorization: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url: an http(s) URL, not {base_url!r}")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self.authorization = basic_authorization(key_id, key_secret, authorization)
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> "Client":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
            self._connection = None

    def _connect(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=self._timeout)

    def _exchange(self, call: Call[Any], headers: dict[str, str]) -> Answer:
        reused = self._connection is not None
        if self._connection is None:
            self._connection = self._connect()
        try:
            self._connection.request(
                call.method, self._prefix + call.target(), call.payload(), headers
            )
            response = self._connection.getresponse()
            received = CIMultiDictProxy(CIMultiDict(response.getheaders()))
            return Answer(response.status, received, response.read())
        except _STALE:
            self._connection.close()
            self._connection = None
            if not reused or call.method not in _SAFE_AGAIN:
                raise
            return self._exchange(call, headers)  # once: the new connection is not reused
        except BaseException:
            self._connection.close()
            self._connection = None
            raise

    def send(self, call: Call[T], authorization: str | None = None) -> T:
        """Run ``call`` with ``authorization`` (None: the client's own; "": none)."""
        headers = call.request_headers(
            self.authorization if authorization is None else authorization
        )
        try:
            with self._lock:
                answer = self._exchange(call, headers)
        except (OSError, http.client.HTTPException) as failed:
            raise Unavailable(503, f"keysvc unreachable: {failed!r}") from failed
        return outcome(call, answer)

    def list_keys(
        self, organization_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page:
        return self.send(calls.list_keys(organization_id, limit, cursor))

    def iter_keys(self, organization_id: str, *, limit: int = 100) -> Iterator[Any]:
        """Every key of the organization, page after page (oldest first)."""
        cursor = None
        while True:
            page = self.list_keys(organization_id, limit=limit, cursor=cursor)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def create_key(self, organization_id: str, body: JsonObject) -> JsonObject:
        """The new key and its credentials (``key``, ``keyId``, ``keySecret``), shown once."""
        return self.send(calls.create_key(organization_id, body))

    def get_key(self, organization_id: str, key_id: str) -> Tagged:
        return self.send(calls.get_key(organization_id, key_id))

    def update_key(
        self, organization_id: str, key_id: str, changes: JsonObject, *, if_match: str | None = None
    ) -> Tagged:
        """PATCH the key; with ``if_match`` (an ETag), a 412 ``Conflict`` if it changed since."""
        return self.send(calls.update_key(organization_id, key_id, changes, if_match))

    def delete_key(self, organization_id: str, key_id: str, *, if_match: str | None = None) -> None:
        self.send(calls.delete_key(organization_id, key_id, if_match))

    def rotate_key(
        self, organization_id: str, key_id: str, body: JsonObject | None = None
    ) -> JsonObject:
        return self.send(calls.rotate_key(organization_id, key_id, body))

    def change_credits(self, organization_id: str, key_id: str, change: JsonObject) -> Tagged:
        """One of ``{"set": n}``, ``{"increment": n}``, ``{"decrement": n}``."""
        return self.send(calls.change_credits(organization_id, key_id, change))

    def key_usage(
        self, organization_id: str, key_id: str, query: Mapping[str, str] | None = None
    ) -> JsonObject:
        return self.send(calls.key_usage(organization_id, key_id, query or {}))

    def list_roles(
        self, organization_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page:
        return self.send(calls.list_roles(organization_id, limit, cursor))

    def create_role(self, organization_id: str, body: JsonObject) -> JsonObject:
        return self.send(calls.create_role(organization_id, body))

    def get_role(self, organization_id: str, role_id: str) -> JsonObject:
        return self.send(calls.get_role(organization_id, role_id))

    def update_role(self, organization_id: str, role_id: str, changes: JsonObject) -> JsonObject:
        return self.send(calls.update_role(organization_id, role_id, changes))

    def delete_role(self, organization_id: str, role_id: str) -> None:
        self.send(calls.delete_role(organization_id, role_id))

    def whoami(self) -> JsonObject:
        return self.send(calls.whoami())

    def verify(self, authorization: str, **asked: Unpack[calls.Requirements]) -> Caller:
        """Who ``authorization`` (a caller's header, as it came) is, if keysvc admits it
        with what is ``asked`` (``calls.Requirements``: permission, organization, cost,
        forwarded_for, full)."""
        return self.send(calls.verify(**asked), authorization)
