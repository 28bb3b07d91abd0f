"""A spend batch whose COMMIT reached PostgreSQL and whose reply was lost (a reset, a
restart, a failover, a pooler): a real connection cut by a loopback relay
(tests/pgfaults.py's ``CommitCutter``) right after it forwards the COMMIT. The
outcome is unknown to keysvc, so nothing is run again: the verify is answered 503
with Retry-After, and the credits are spent once, never twice."""

from collections.abc import AsyncIterator

import pytest

from keysvc.config import Settings
from keysvc.http.app import create_app
from tests.helpers import (
    Client,
    ClientFactory,
    assert_error,
    bootstrap,
    create_creds,
    get_key,
)
from tests.pgfaults import CommitCutter
from tests.postgres import PEPPER, SUPERUSER, Postgres

# The spend's write (keysvc.db.credits.WRITE_SPENT), as its Parse message carries it.
SPEND = b"update key_details set credits_remaining"
COST = 10


@pytest.fixture
async def cutter(postgres: Postgres) -> AsyncIterator[CommitCutter]:
    relay = CommitCutter(postgres.port)
    yield relay
    await relay.close()


@pytest.fixture
async def client(
    postgres: Postgres, pg_database: str, cutter: CommitCutter, aiohttp_client: ClientFactory
) -> AsyncIterator[Client]:
    port = await cutter.start()
    url = f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{pg_database}"
    started = await aiohttp_client(create_app(Settings(db_url=url, pepper=PEPPER)))
    yield started
    await started.close()


async def test_a_spend_whose_commit_reply_is_lost_is_answered_503_and_spent_once(
    client: Client, cutter: CommitCutter
) -> None:
    admin = await bootstrap(client.app)
    body = {"name": "metered", "roles": ["developer"], "credits": {"remaining": 100}}
    key = await create_creds(client, admin, body)
    cutter.marker = SPEND
    response = await client.get("/v1/verify", headers={**key.headers, "X-Credit-Cost": str(COST)})
    assert cutter.cuts == 1
    await assert_error(response, 503, "database unavailable")
    assert response.headers["Retry-After"] == "5"
    # The COMMIT reached the database: spent once, never again by a retry.
    assert (await get_key(client, admin, key.id))["credits"]["remaining"] == 100 - COST
    again = await client.get("/v1/verify", headers={**key.headers, "X-Credit-Cost": str(COST)})
    assert again.status == 200
    assert again.headers["X-Credits-Remaining"] == str(100 - 2 * COST)
