"""Writes queued on a frozen PostgreSQL server (every process of a real cluster of
this module's own SIGSTOPped): each waits on the writer's in-process lock only for what
is left of its bound (ACQUIRE_SECONDS + STATEMENT_SECONDS), then 503 with Retry-After;
/readyz, the pooled connection's wait included, answers within READY_SECONDS."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from keysvc.config import Settings
from keysvc.db.postgres.connection import ACQUIRE_SECONDS, READY_SECONDS, STATEMENT_SECONDS
from keysvc.http.app import create_app
from tests.helpers import Client, ClientFactory, assert_error, bootstrap, keys_url
from tests.pgfaults import frozen, module_cluster, timed
from tests.postgres import PEPPER, Postgres

# Concurrent writes on a frozen server: without a bound on the in-process lock, the
# last is answered after about 5 + 5 * WRITES seconds.
WRITES = 5
BODY = {"name": "k", "roles": ["developer"]}


postgres = module_cluster()


@pytest.fixture
async def client(
    postgres: Postgres, pg_database: str, aiohttp_client: ClientFactory
) -> AsyncIterator[Client]:
    started = await aiohttp_client(
        create_app(Settings(db_url=postgres.url(pg_database), pepper=PEPPER))
    )
    yield started
    await started.close()


async def test_queued_writes_on_a_frozen_database_are_each_answered_within_the_bound(
    client: Client, postgres: Postgres
) -> None:
    admin = await bootstrap(client.app)
    # Creates: the writer's transaction is their first call to the database (a disable
    # reads its key first, on the pool, and is answered 503 there).
    with frozen(postgres):
        writes = [
            asyncio.create_task(timed(client, "POST", keys_url(admin), BODY, admin.headers))
            for _ in range(WRITES)
        ]
        await asyncio.sleep(0.5)
        ready, ready_took = await timed(client, "GET", "/readyz")
        answered = await asyncio.gather(*writes)
    await assert_error(ready, 503, "not ready: the database does not answer")
    assert ready_took < READY_SECONDS + 0.5, ready_took
    for response, took in answered:
        await assert_error(response, 503, "database unavailable")
        assert response.headers["Retry-After"] == "5"
        assert took < ACQUIRE_SECONDS + STATEMENT_SECONDS + 1.0, took
