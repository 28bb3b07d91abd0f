"""A PostgreSQL server that takes no writes (a failover to a standby, or
default_transaction_read_only on keysvc's database, as here on a real cluster):
writes are a 503 with Retry-After, never a 500 with a traceback, and /readyz says not
ready."""

from collections.abc import AsyncIterator

import pytest

from keysvc.config import Settings
from keysvc.http.app import create_app
from tests.helpers import Client, ClientFactory, assert_error, bootstrap, keys_url
from tests.postgres import PEPPER, Postgres

BODY = {"name": "k", "roles": ["developer"]}


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    """Asked for before aiohttp_client: the database outlives the app."""
    return postgres.url(pg_database)


@pytest.fixture
async def client(url: str, aiohttp_client: ClientFactory) -> AsyncIterator[Client]:
    started = await aiohttp_client(create_app(Settings(db_url=url, pepper=PEPPER)))
    yield started
    await started.close()


async def test_a_read_only_database_is_503_and_not_ready(
    client: Client, postgres: Postgres, pg_database: str
) -> None:
    admin = await bootstrap(client.app)
    assert (await client.get("/readyz")).status == 200
    postgres.psql(
        "postgres", f"alter database {pg_database} set default_transaction_read_only = on"
    )
    # Its settings apply to new connections: keysvc's are made again.
    postgres.psql(
        "postgres",
        "select pg_terminate_backend(pid) from pg_stat_activity"
        f" where datname = '{pg_database}' and pid <> pg_backend_pid()",
    )
    for _ in range(3):
        response = await client.post(keys_url(admin), json=BODY, headers=admin.headers)
        await assert_error(response, 503, "database unavailable")
        assert response.headers["Retry-After"] == "5"
    ready = await client.get("/readyz")
    await assert_error(ready, 503, "not ready: the database does not answer")
