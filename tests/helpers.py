"""Helpers shared by the tests: credentials, Basic headers, envelope checks, and the
API helpers the fixtures and tests use (bootstrap, create, create_creds, create_role,
client_with)."""

import asyncio
import base64
import dataclasses
import socket
import sqlite3
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient

from keysvc.config import Settings
from keysvc.credentials import sha256_b64
from keysvc.db.meta import GENERATION
from keysvc.db.sqlite.store import Store
from keysvc.domain import keys
from keysvc.http.app import create_app
from keysvc.http.state import CLOCK, HASHER, STORE

_seen_request_ids: set[str] = set()
# The names of the app's background tasks (webhook delivery, shared limits, PostgreSQL's
# notifications): what they run is not a request's work.
BACKGROUND_TASKS = "keysvc-"

UNAUTHORIZED = "invalid credentials: send Authorization: Basic base64(keyId:keySecret)"
# The 401 of a rotated key's replaced key ID and secret, their grace over.
ROTATED = "key is rotated: use its new credentials"
FAR_FUTURE = "2099-01-01T00:00:00Z"
# The entries of the long lists the list-limit tests send (API and server alike).
ENTRIES = 9_000

ClientFactory = Callable[..., Awaitable[TestClient[web.Request, web.Application]]]
Client = TestClient[web.Request, web.Application]


@dataclass(frozen=True)
class Creds:
    organization_id: str
    id: str
    key_id: str
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return basic(self.key_id, self.secret)


class FakeClock:
    """A clock the tests move by hand."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def hash_data(key_id: str, secret: str) -> dict[str, str]:
    """The hashData a client sends when it chooses its own key ID and secret."""
    return {
        "keyIdHash": sha256_b64(key_id),
        "keyIdSuffix": key_id[-4:],
        "keySecretHash": sha256_b64(secret),
    }


def basic(key_id: str, secret: str) -> dict[str, str]:
    token = base64.b64encode(f"{key_id}:{secret}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def assert_request_id(body: dict[str, Any], response: ClientResponse) -> None:
    """requestId is a UUIDv4, never seen before, and echoed in X-Request-Id."""
    request_id = body["requestId"]
    assert uuid.UUID(request_id).version == 4
    assert str(uuid.UUID(request_id)) == request_id
    assert response.headers["X-Request-Id"] == request_id
    assert request_id not in _seen_request_ids
    _seen_request_ids.add(request_id)


async def assert_ok(response: ClientResponse) -> Any:
    """A 200 envelope; returns its result (None when it has none)."""
    body = await response.json()
    assert response.status == 200, body
    assert body["status"] == 200
    assert "error" not in body
    assert_request_id(body, response)
    return body.get("result")


async def assert_error(response: ClientResponse, status: int, message: str) -> dict[str, Any]:
    """The whole error envelope: status, exact message, and a fresh UUIDv4 requestId."""
    assert response.content_type == "application/json"
    body = await response.json()
    assert response.status == status, body
    assert set(body) == {"status", "error", "requestId"}, body
    assert body["status"] == status
    assert body["error"] == message
    assert_request_id(body, response)
    return body


def for_requests() -> bool:
    """Whether the statement about to run is the requests' work rather than one of the
    app's own background tasks' (named ``keysvc-...``): on PostgreSQL the webhook
    delivery task polls through the store's reader, the same pool the requests read
    from, once a second and after every commit, so a count of the requests' statements
    must leave its reads out."""
    task = asyncio.current_task()
    return task is None or not task.get_name().startswith(BACKGROUND_TASKS)


def count_statements(conn: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement ``conn`` runs from now on for requests (``for_requests``),
    whitespace collapsed, by any of the ways aiosqlite runs one."""
    seen: list[str] = []
    for name in ("execute", "executemany", "execute_fetchall"):
        # PostgreSQL's reader answers execute_fetchall alone (keysvc.db.postgres.store).
        if not hasattr(conn, name):
            continue
        original = getattr(conn, name)

        def counting(sql: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if for_requests():
                seen.append(" ".join(sql.split()))
            return _original(sql, *args, **kwargs)

        monkeypatch.setattr(conn, name, counting)
    return seen


def count_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the store's reader connection runs from now on, and those its
    point reader runs on the loop."""
    seen = count_statements(store.reader, monkeypatch)
    original = store.points.rows

    async def counting(sql: str, params: Sequence[object], *accept: Any) -> list[sqlite3.Row]:
        if for_requests():
            seen.append(" ".join(sql.split()))
        return await original(sql, params, *accept)

    monkeypatch.setattr(store.points, "rows", counting)
    return seen


async def settled(app: web.Application, timeout: float = 30) -> None:
    """Return once the app's caches are at the authorization generation committed now.

    On PostgreSQL an instance learns that the generation moved from the announcement
    its listening connection hears, some time after the commit: a bootstrap's key
    roles, say. Heard in the middle of a test, it drops the cached credentials, and
    the next request checks its credentials once more. A test that counts checks or
    statements settles first. On SQLite the caches read the generation at once."""
    store = app[STORE]
    rows = await store.reader.execute_fetchall(GENERATION)
    committed = str(rows[0][0])
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        store.caches.data_version()  # brings the caches' generation up to date
        if str(store.caches.generation) == committed:
            return
        assert asyncio.get_running_loop().time() < deadline, "the generation was never heard"
        await asyncio.sleep(0.01)


async def client_with(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, **changes: Any
) -> Client:
    """A client of its own app, whose settings are the fixture's with ``changes``."""
    return await aiohttp_client(create_app(dataclasses.replace(settings, **changes), clock=clock))


async def exploding_client(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> Client:
    """A client of an app with one more route, ``GET /v1/explode``, whose view fails
    with a RuntimeError that names internals: an internal error on demand."""

    async def explode(request: web.Request) -> web.Response:
        raise RuntimeError("secret internals: /etc/passwd")

    app = create_app(settings, clock=clock)
    app.router.add_get("/v1/explode", explode)
    return await aiohttp_client(app)


def keys_url(creds: Creds, key: str | None = None) -> str:
    """The keys of ``creds``'s organization, or one of them."""
    base = f"/v1/organizations/{creds.organization_id}/keys"
    return base if key is None else f"{base}/{key}"


async def get_key(client: Client, caller: Creds, key_id: str) -> dict[str, Any]:
    """The key ``key_id`` as ``caller`` reads it (GET of the key, a 200 envelope)."""
    result: dict[str, Any] = await assert_ok(
        await client.get(keys_url(caller, key_id), headers=caller.headers)
    )
    return result


async def bootstrap(app: web.Application, name: str = "acme") -> Creds:
    """A new organization and its admin key, made the way `keysvc bootstrap` makes them."""
    org, issued = await keys.bootstrap(app[STORE], app[HASHER], name, app[CLOCK]())
    assert issued.key_id and issued.secret
    return Creds(org.id, issued.key.id, issued.key_id, issued.secret)


async def create_role(client: Client, caller: Creds, body: dict[str, Any]) -> dict[str, Any]:
    """Create a custom role through the API and return it."""
    response = await client.post(
        f"/v1/organizations/{caller.organization_id}/roles", json=body, headers=caller.headers
    )
    result: dict[str, Any] = await assert_ok(response)
    return result


async def create(client: Client, caller: Creds, body: dict[str, Any]) -> dict[str, Any]:
    """Create a key through the API and return the whole create result."""
    response = await client.post(
        f"/v1/organizations/{caller.organization_id}/keys", json=body, headers=caller.headers
    )
    result: dict[str, Any] = await assert_ok(response)
    return result


async def create_creds(client: Client, caller: Creds, body: dict[str, Any]) -> Creds:
    result = await create(client, caller, body)
    return Creds(caller.organization_id, result["key"]["id"], result["keyId"], result["keySecret"])


def write_sql(db: Path, statement: str, *params: object) -> None:
    """One statement committed on the database file, as an operator's (or an
    attacker's) ``sqlite3`` shell would."""
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute(statement, params)
    finally:
        conn.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def ip_list(letter: str) -> list[dict[str, str]]:
    return [{"source": f"10.0.{n}.0/24", "description": letter * 255} for n in range(100)]
