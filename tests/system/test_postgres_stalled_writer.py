"""A writer that stops talking inside its write transaction (a `keysvc import` paused
with Ctrl-Z mid-batch, a frozen instance, a client cut off from the database) held
keysvc_locks' write row, and so every tenant's writes, for as long as it stayed
stopped: another organization's disable got a 503 after 15 s, again and again (the
hostile review rt63 F1). Each write transaction now tells PostgreSQL to end it once it
idles longer than ``IDLE_IN_WRITE_SECONDS``, so the row is let go: the disable goes
through, and the stopped writer's transaction is rolled back whole, its next statement
a 503's DatabaseUnavailable."""

import asyncio
import time

import pytest

from keysvc.config import Settings
from keysvc.db.backends import open_store
from keysvc.db.postgres import store as pg_store
from keysvc.errors import DatabaseUnavailable
from keysvc.http.app import create_app
from tests.helpers import ClientFactory, assert_ok, bootstrap, create_creds, keys_url
from tests.postgres import PEPPER, Postgres

MARKER = "stalled-writer"


async def test_a_stopped_writer_lets_other_tenants_write(
    postgres: Postgres,
    pg_database: str,
    aiohttp_client: ClientFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pg_store, "IDLE_IN_WRITE_SECONDS", 2.0)
    settings = Settings(db_url=postgres.url(pg_database), pepper=PEPPER.hex().encode())
    client = await aiohttp_client(create_app(settings))
    admin = await bootstrap(client.app)
    key = await create_creds(client, admin, {"name": "k", "roles": ["developer"]})
    async with open_store(settings) as (stalled, _):
        holding = asyncio.Event()

        async def stop_mid_transaction() -> None:
            async with stalled.transaction("import_keys") as conn:
                await conn.execute("update organizations set name = ? where id = ?",
                                   (MARKER, admin.organization_id))  # fmt: skip
                holding.set()
                await asyncio.sleep(6)  # stopped: the session idles in its transaction
                await conn.execute("select 1")

        stopped = asyncio.create_task(stop_mid_transaction())
        await asyncio.wait_for(holding.wait(), 10)
        started = time.monotonic()
        response = await client.patch(
            keys_url(admin, key.id), json={"state": "disabled"}, headers=admin.headers
        )
        waited = time.monotonic() - started
        assert (await assert_ok(response))["state"] == "disabled"
        assert 1.5 < waited < 5, waited  # the idle bound, not the 15 s of a write's wait
        with pytest.raises(DatabaseUnavailable):
            await stopped
    name = f"select name from organizations where id = '{admin.organization_id}'"
    assert postgres.psql(pg_database, name) != [[MARKER]]  # rolled back whole
