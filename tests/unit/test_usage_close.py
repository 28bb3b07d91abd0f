"""A clean stop writes each usage count once: a background flush whose commit is
under way when the serving store closes runs to its end, and close writes only
what is left. Through the store itself (``open_checked(serving=True)``, as the app
opens it) on a real database: in the app, the webhooks' own write at shutdown
usually queues the close behind such a flush, so only here can a test make the
close land in the commit every time."""

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.db.sqlite.store import open_checked
from keysvc.domain import keys
from keysvc.timeutil import to_minute, utcnow

# Long enough that the close, asked for once the commit has run, comes before the
# flush ends; a flush that is not cancelled only waits this long.
LINGER_SECONDS = 1.0


async def test_a_flush_committing_as_the_store_closes_is_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(db_path=tmp_path / "keysvc.db", usage_flush_seconds=0.05)
    committed = asyncio.Event()
    async with open_checked(settings, serving=True) as (store, hasher):
        _, issued = await keys.bootstrap(store, hasher, "acme", utcnow())
        conn = store.writer.conn
        execute: Callable[..., Awaitable[Any]] = conn.execute

        async def commit_then_linger(sql: str, *args: Any) -> Any:
            """The first commit, then a pause: the close below arrives while the
            commit's answer is still on its way back to the flush."""
            result = await execute(sql, *args)
            if sql == "commit" and not committed.is_set():
                committed.set()
                await asyncio.sleep(LINGER_SECONDS)
            return result

        monkeypatch.setattr(conn, "execute", commit_then_linger)
        minute = to_minute(utcnow())
        for _ in range(3):
            store.count_use(issued.key.id, minute, 0)  # as the auth middleware counts
        # The background flush (every 0.05 s) takes the counts and commits them.
        await asyncio.wait_for(committed.wait(), timeout=30)
    # Closed (open_checked's exit): as at SIGTERM, the usage upkeep is stopped first.
    db = sqlite3.connect(settings.db_path)
    try:
        rows = db.execute(
            "select sum(success) from key_usage where key_id = ?", (issued.key.id,)
        ).fetchall()
    finally:
        db.close()
    assert rows == [(3,)]
