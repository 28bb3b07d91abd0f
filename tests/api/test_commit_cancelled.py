"""A write transaction cancelled while its commit is under way: the commit runs on
aiosqlite's thread whatever happens to the coroutine awaiting it, so the writer waits
for it, does what a commit does (the caches told of an authorization change), and
only then lets the cancellation through."""

import asyncio
from typing import Any

import pytest

from keysvc.db.sqlite.store import Store
from keysvc.domain.keys import change_key
from keysvc.http.state import HASHER, STORE
from keysvc.models import KeyChange
from tests.helpers import Client, Creds, assert_ok, create_creds

# SQLite's writer (aiosqlite's thread); PostgreSQL's: tests/system/test_postgres_cancel.py
pytestmark = pytest.mark.sqlite_only


async def test_a_cancelled_commit_still_counts_as_committed(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    store: Store = client.app[STORE]
    victim = await create_creds(client, admin, {"name": "v", "roles": ["developer"]})
    await assert_ok(await client.get("/v1/whoami", headers=victim.headers))  # cached
    conn = store.writer.conn
    original = conn.execute
    committing = asyncio.Event()

    def slow_commit(sql: str, *args: Any) -> Any:
        if sql != "commit":
            return original(sql, *args)
        committed = asyncio.ensure_future(original(sql, *args))  # goes on regardless

        async def awaiting() -> Any:
            committing.set()
            await asyncio.sleep(0.2)  # the cancellation lands here, the commit goes on
            return await committed

        return awaiting()

    monkeypatch.setattr(conn, "execute", slow_commit)
    task = asyncio.create_task(
        change_key(store, admin.organization_id, victim.id, KeyChange(state="disabled"))
    )
    await committing.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    monkeypatch.undo()
    # Committed, and this process's caches know it: the key is refused at once.
    assert (await store.get_key(admin.organization_id, victim.id)).state == "disabled"  # type: ignore[union-attr]
    assert store.caches.cached_credential(client.app[HASHER].of_plain(victim.key_id)) is None
    refused = await client.get("/v1/whoami", headers=victim.headers)
    assert refused.status == 401
    # And the writer is free for the next write.
    await change_key(store, admin.organization_id, victim.id, KeyChange(name="w"))
