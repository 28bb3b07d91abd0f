"""Point reads on the event loop (keysvc.db.sqlite.pointreads): one statement per miss, no
thread hand-over, and a read refused as busy run again on the reader's thread, so
the loop never waits for a lock."""

import sqlite3
from typing import Any

import pytest

from keysvc.db.sqlite.store import Store
from keysvc.http.state import STORE
from tests.helpers import Client, Creds, assert_ok, count_reads, count_statements, create_creds


async def test_a_key_not_in_memory_is_read_in_one_statement_on_the_loop(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: Store = client.app[STORE]
    other = await create_creds(client, admin, {"name": "other", "roles": ["developer"]})
    await assert_ok(await client.get("/v1/whoami", headers=admin.headers))  # admin in memory
    handed_over: list[str] = []
    fetch_all = store.reader.execute_fetchall

    def hand_over(sql: str, *args: Any) -> Any:
        if "webhook_deliveries" in sql:  # the delivery task's poll, beside the request
            return fetch_all(sql, *args)
        handed_over.append(sql)
        return None

    monkeypatch.setattr(store.reader, "execute_fetchall", hand_over)
    reads = count_reads(store, monkeypatch)
    url = f"/v1/organizations/{admin.organization_id}/keys/{other.id}"
    got = await assert_ok(await client.get(url, headers=admin.headers))
    assert got["id"] == other.id and got["roles"] == ["developer"]
    assert len(reads) == 1 and "left join roles" in reads[0]
    assert handed_over == []  # nothing went to the reader's thread


class _Refusing:
    """A connection whose next statement SQLite refuses with ``code`` (a fault
    injected below the point reader), then the real connection's."""

    def __init__(self, conn: sqlite3.Connection, code: int):
        self.conn, self.code = conn, code

    def execute(self, sql: str, params: object) -> sqlite3.Cursor:
        if self.code:
            error = sqlite3.OperationalError("refused")
            error.sqlite_errorcode = self.code  # type: ignore[attr-defined]
            self.code = 0
            raise error
        return self.conn.execute(sql, params)  # type: ignore[arg-type]


@pytest.mark.sqlite_only  # SQLite's busy reader
async def test_a_busy_database_is_read_on_the_readers_thread(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A point read SQLite refuses as busy (it never waits on the loop) is run again
    on the reader's thread, which may wait for the lock; any other error is raised."""
    store: Store = client.app[STORE]
    other = await create_creds(client, admin, {"name": "other", "roles": ["developer"]})
    handed_over = count_statements(store.reader, monkeypatch)
    monkeypatch.setattr(store.points, "conn", _Refusing(store.points.conn, sqlite3.SQLITE_BUSY))
    key = await store.get_key(admin.organization_id, other.id)
    assert key is not None and key.id == other.id
    assert len(handed_over) == 1 and "left join roles" in handed_over[0]
    store.caches.authorization_changed()
    monkeypatch.setattr(store.points, "conn", _Refusing(store.points.conn, sqlite3.SQLITE_IOERR))
    with pytest.raises(sqlite3.OperationalError):
        await store.find_credential(b"x" * 32)


@pytest.mark.sqlite_only  # SQLite's write lock
async def test_the_point_reader_never_waits_for_a_lock(client: Client) -> None:
    store: Store = client.app[STORE]
    (timeout,) = store.points.conn.execute("pragma busy_timeout").fetchone()
    (query_only,) = store.points.conn.execute("pragma query_only").fetchone()
    assert (timeout, query_only) == (0, 1)
