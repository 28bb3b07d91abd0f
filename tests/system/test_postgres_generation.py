"""The authorization generation on PostgreSQL (keysvc.db.postgres.store), through the real app
on a real server (tests/postgres.py): it only moves forward, as the instances'
acknowledgements of it need (a new key's role rows leave it where it is, rather than
moving it and putting it back); and an instance's own change stands for a new
generation at once, before its announcement comes back, so that a read begun before
the change cannot keep what it read."""

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from keysvc.config import Settings
from keysvc.db.meta import GENERATION
from keysvc.http.app import create_app
from keysvc.http.state import STORE
from tests.helpers import Client, ClientFactory, assert_ok, bootstrap, create_creds
from tests.postgres import PEPPER, Postgres

VERIFY = "/v1/verify"


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    """Asked for before aiohttp_client: the database outlives the app."""
    return postgres.url(pg_database)


@pytest.fixture
async def client(url: str, aiohttp_client: ClientFactory) -> AsyncIterator[Client]:
    started = await aiohttp_client(create_app(Settings(db_url=url, pepper=PEPPER)))
    yield started
    await started.close()


async def test_a_new_keys_roles_leave_the_generation_where_it_is(client: Client, url: str) -> None:
    admin = await bootstrap(client.app)
    listening = await asyncpg.connect(url)
    heard: asyncio.Queue[str] = asyncio.Queue()
    try:

        def put(conn: Any, pid: int, channel: str, payload: str) -> None:
            if channel == "keysvc_auth":
                heard.put_nowait(f"auth {payload}")
            else:
                heard.put_nowait("marker" if payload == "marker" else "data")

        await listening.add_listener("keysvc_auth", put)
        await listening.add_listener("keysvc_data", put)
        before = await listening.fetchval(GENERATION)
        body = {"name": "svc", "roles": ["developer", "query_endpoints"]}
        await create_creds(client, admin, body)
        # A later transaction's announcement comes after all of the create's.
        await listening.execute("select pg_notify('keysvc_data', 'marker')")
        announced = [await asyncio.wait_for(heard.get(), 10)]
        while announced[-1] != "marker":
            announced.append(await asyncio.wait_for(heard.get(), 10))
        assert [payload for payload in announced if payload != "data"] == ["marker"]
        assert await listening.fetchval(GENERATION) == before
    finally:
        await listening.close()


async def test_a_read_across_the_instances_own_change_is_not_kept(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verify reads a key's credential, its read held until the key has been
    disabled through the same instance, whose own announcement of the change is held
    back (its listening connection's server process stopped): the next verify is
    refused, as the credential read before the change is not cached."""
    admin = await bootstrap(client.app)
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    store = client.app[STORE]
    gate, reading = asyncio.Event(), asyncio.Event()
    original = store.points.rows

    async def held(sql: str, params: Sequence[object], *accept: Any) -> list[Any]:
        rows = await original(sql, params, *accept)
        if not reading.is_set():
            reading.set()
            await gate.wait()
        return rows

    monkeypatch.setattr(store.points, "rows", held)
    pid = store.notifications.backend_pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        first = asyncio.create_task(client.get(VERIFY, headers=svc.headers))
        await asyncio.wait_for(reading.wait(), 10)
        url = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}"
        await assert_ok(await client.patch(url, json={"state": "disabled"}, headers=admin.headers))
        gate.set()
        assert (await first).status == 200  # read before the change: answered as it was
        assert (await client.get(VERIFY, headers=svc.headers)).status == 401
    finally:
        os.kill(pid, signal.SIGCONT)
