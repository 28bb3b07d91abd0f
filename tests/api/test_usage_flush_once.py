"""A usage flush writes the counts it finds once, and ends: requests counted while it
commits wait for the next flush. A flush that went on while any count was waiting
would never end under steady traffic, and each of its commits would make every
instance read again what it had cached."""

import asyncio
from typing import Any

import pytest

from keysvc.db import usage as usage_sql
from keysvc.http.state import STORE
from tests.helpers import Client, Creds


async def test_a_flush_writes_once_while_requests_keep_counting(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    writes: list[int] = []
    original = usage_sql.add_counts

    async def counting(conn: Any, counts: usage_sql.Counts) -> None:
        writes.append(len(counts))
        await original(conn, counts)

    monkeypatch.setattr(usage_sql, "add_counts", counting)
    # usedAt is written for the minute: the requests below only count.
    assert (await client.get("/v1/verify", headers=admin.headers)).status == 200
    await client.app[STORE].write_usage()
    writes.clear()

    assert (await client.get("/v1/verify", headers=admin.headers)).status == 200
    flush = asyncio.create_task(client.app[STORE].write_usage())
    for _ in range(60):
        assert (await client.get("/v1/verify", headers=admin.headers)).status == 200
    await flush
    assert len(writes) == 1, writes
    # What was counted meanwhile is written by the next flush, at once.
    await client.app[STORE].write_usage()
    assert len(writes) == 2
