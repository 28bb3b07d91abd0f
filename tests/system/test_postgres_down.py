"""PostgreSQL gone from under a serving app (tests/postgres.py's real cluster): every
connection dropped and no new one accepted, requests that need the database get 503
"database unavailable" with Retry-After, never 500, with one log line; once the
database accepts connections again the pool makes new ones by itself and writes resume."""

import asyncio
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest

from keysvc.config import Settings
from keysvc.http.app import create_app
from tests.helpers import Client, ClientFactory, assert_error, bootstrap
from tests.postgres import PEPPER, Postgres

RECOVERY_SECONDS = 30.0
BODY = {"name": "k", "roles": ["developer"]}


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    return postgres.url(pg_database)


@pytest.fixture
async def client(url: str, aiohttp_client: ClientFactory) -> AsyncIterator[Client]:
    started = await aiohttp_client(create_app(Settings(db_url=url, pepper=PEPPER)))
    yield started
    await started.close()


async def _close(admin: asyncpg.Connection, database: str, closed: bool) -> None:
    """Refuse (or accept again) connections to ``database``, dropping every one it has."""
    await admin.execute(f'alter database "{database}" allow_connections {str(not closed).lower()}')
    if closed:
        await admin.execute(
            "select pg_terminate_backend(pid) from pg_stat_activity where datname = $1",
            database,
        )


async def test_a_database_that_drops_and_refuses_connections_gets_503_then_recovers(
    client: Client,
    postgres: Postgres,
    pg_database: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    creds = await bootstrap(client.app)
    url = f"/v1/organizations/{creds.organization_id}/keys"
    admin = await asyncpg.connect(postgres.url("postgres"))
    try:
        with caplog.at_level(logging.WARNING, logger="keysvc"):
            await _close(admin, pg_database, closed=True)
            for _ in range(3):
                response = await client.post(url, json=BODY, headers=creds.headers)
                await assert_error(response, 503, "database unavailable")
                assert response.headers["Retry-After"] == "5"
            down = [r for r in caplog.records if "PostgreSQL unavailable" in r.getMessage()]
            assert len(down) == 1
        await _close(admin, pg_database, closed=False)
        deadline = asyncio.get_running_loop().time() + RECOVERY_SECONDS
        while True:
            response = await client.post(url, json=BODY, headers=creds.headers)
            if response.status == 200 or asyncio.get_running_loop().time() > deadline:
                break
            assert response.status == 503
            response.release()
            await asyncio.sleep(0.5)
        assert response.status == 200
        listed = await client.get(url, headers=creds.headers)
        names = [key["name"] for key in (await listed.json())["result"]]
        assert names.count("k") == 1  # the refused creates wrote nothing
    finally:
        await _close(admin, pg_database, closed=False)
        await admin.close()
