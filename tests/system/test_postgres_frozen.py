"""A PostgreSQL server that stops answering without closing anything (every process of
a real cluster of this module's own SIGSTOPped, as behind a partition that drops
packets): every route answers within its bound, 503 with Retry-After where it needs
the database, `/readyz` says not ready within a few seconds; SIGCONT, and the app
recovers by itself. And the same server stopped: `/metrics` is still served."""

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from keysvc.config import Settings
from keysvc.db.postgres.connection import ACQUIRE_SECONDS, READY_SECONDS, STATEMENT_SECONDS
from keysvc.http.app import create_app
from tests.helpers import Client, ClientFactory, assert_error, bootstrap, create_creds, keys_url
from tests.pgfaults import frozen, module_cluster, timed
from tests.postgres import PEPPER, Postgres

# The longest a request may take against a frozen server: a pooled connection waited
# for, then its statement, with room for a loaded machine.
BOUND = ACQUIRE_SECONDS + STATEMENT_SECONDS + 3.0
RECOVERY_SECONDS = 30.0
BODY = {"name": "k", "roles": ["developer"]}


postgres = module_cluster()


@pytest.fixture
async def client(
    postgres: Postgres, pg_database: str, aiohttp_client: ClientFactory
) -> AsyncIterator[Client]:
    settings = Settings(db_url=postgres.url(pg_database), pepper=PEPPER, metrics=True)
    started = await aiohttp_client(create_app(settings))
    yield started
    await started.close()


async def test_a_frozen_database_is_503_within_the_bound_and_recovers(
    client: Client, postgres: Postgres
) -> None:
    admin = await bootstrap(client.app)
    key = await create_creds(client, admin, BODY)
    url = keys_url(admin)
    with frozen(postgres):
        ready, took = await timed(client, "GET", "/readyz")
        await assert_error(ready, 503, "not ready: the database does not answer")
        assert took < READY_SECONDS + 2.0, took
        for method, path, body in (
            ("GET", url, None),
            ("POST", url, BODY),
            ("PATCH", f"{url}/{key.id}", {"state": "disabled"}),
        ):
            response, took = await timed(client, method, path, body, admin.headers)
            await assert_error(response, 503, "database unavailable")
            assert response.headers["Retry-After"] == "5"
            assert took < BOUND, (method, took)
        healthy, took = await timed(client, "GET", "/healthz")
        assert healthy.status == 200
    deadline = time.monotonic() + RECOVERY_SECONDS
    while (response := await client.post(url, json=BODY, headers=admin.headers)).status != 200:
        assert response.status == 503 and time.monotonic() < deadline, response.status
        response.release()
        await asyncio.sleep(0.5)
    assert (await client.get("/readyz")).status == 200


async def test_metrics_are_served_while_the_database_is_stopped(
    client: Client, postgres: Postgres
) -> None:
    await bootstrap(client.app)
    postgres.run("pg_ctl", "stop", "--mode=fast", f"--pgdata={postgres.data}")
    try:
        scraped = await client.get("/metrics")
        assert scraped.status == 200
        text = await scraped.text()
        assert "keysvc_keys_counted 0.0" in text
        assert 'keysvc_keys{state="enabled"}' in text
    finally:
        postgres.restart()
    deadline = time.monotonic() + RECOVERY_SECONDS
    while (scraped := await client.get("/metrics")).status != 200 or (
        "keysvc_keys_counted 1.0" not in await scraped.text()
    ):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.5)
