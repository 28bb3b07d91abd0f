"""Helpers shared by the tests: credentials, Basic headers, envelope checks."""

import base64
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiosqlite
import pytest
from aiohttp import ClientResponse

from keysvc.credentials import sha256_b64
from keysvc.db.store import Store

_seen_request_ids: set[str] = set()

UNAUTHORIZED = "invalid credentials: send Authorization: Basic base64(keyId:keySecret)"
FAR_FUTURE = "2099-01-01T00:00:00Z"


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


def count_statements(conn: aiosqlite.Connection, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement ``conn`` runs from now on, whitespace collapsed, by any of the
    ways aiosqlite runs one."""
    seen: list[str] = []
    for name in ("execute", "executemany", "execute_fetchall"):
        original = getattr(conn, name)

        def counting(sql: str, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            seen.append(" ".join(sql.split()))
            return _original(sql, *args, **kwargs)

        monkeypatch.setattr(conn, name, counting)
    return seen


def count_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement the store's reader connection runs from now on."""
    return count_statements(store.reader, monkeypatch)
