"""A role that may only CONNECT to keysvc's database (PUBLIC's default), with no grant
of keysvc's, tries to hold the locks keysvc serializes on: the old advisory keys
(WRITE_LOCK's and MIGRATION_LOCK's) it may take, but keysvc no longer waits on them,
and keysvc's own lock table (``keysvc_locks``) refuses it. Writes, revocations
included, go on; a new instance starts and serves."""

import json
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from keysvc.config import Settings
from keysvc.http.app import create_app
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    assert_ok,
    bootstrap,
    create_creds,
    keys_url,
)
from tests.pgfaults import login_role
from tests.postgres import PEPPER, Postgres
from tests.server import Server, call, keysvc

# keysvc's advisory keys before they moved to keysvc_locks (store.WRITE_LOCK,
# schema.MIGRATION_LOCK): any role that may connect can take them.
OLD_WRITE_LOCK = 0x6B657977
OLD_MIGRATION_LOCK = 0x6B657973
LOCKS_TABLE = "keysvc_locks"
ENV = {"KEYSVC_PEPPER": PEPPER.hex()}
BODY = {"name": "k", "roles": ["developer"]}


mallory = login_role()


@pytest.fixture
async def admin(client: Client) -> Creds:
    """Made before ``holder`` takes its locks."""
    return await bootstrap(client.app)


@pytest.fixture
def made(postgres: Postgres, pg_database: str) -> dict[str, str]:
    """`keysvc bootstrap`'s output, run before ``holder`` takes its locks."""
    done = keysvc("bootstrap", "--db", postgres.url(pg_database), env=ENV)
    assert done.returncode == 0, done.stderr
    created: dict[str, str] = json.loads(done.stdout)
    return created


@pytest.fixture
async def holder(postgres: Postgres, pg_database: str, mallory: str) -> AsyncIterator[list[str]]:
    """Mallory's connection to keysvc's database, holding every lock it could take;
    what the server answered to each attempt on keysvc's lock table."""
    url = f"postgresql://{mallory}@127.0.0.1:{postgres.port}/{pg_database}"
    conn = await asyncpg.connect(url)
    await conn.execute("select pg_advisory_lock($1), pg_advisory_lock($2)",
                       OLD_WRITE_LOCK, OLD_MIGRATION_LOCK)  # fmt: skip
    refused: list[str] = []
    for attempt in (
        f"select * from {LOCKS_TABLE} for update",
        f"lock table {LOCKS_TABLE} in exclusive mode",
        f"lock table {LOCKS_TABLE} in access share mode",
    ):
        try:
            async with conn.transaction():
                await conn.execute(attempt)
        except asyncpg.PostgresError as exc:
            refused.append(type(exc).__name__)
        else:
            refused.append("taken")
    yield refused
    await conn.close()


@pytest.fixture
async def client(
    postgres: Postgres, pg_database: str, aiohttp_client: ClientFactory
) -> AsyncIterator[Client]:
    settings = Settings(db_url=postgres.url(pg_database), pepper=PEPPER)
    started = await aiohttp_client(create_app(settings))
    yield started
    await started.close()


async def test_a_connect_only_role_cannot_stop_a_revocation(
    client: Client, admin: Creds, holder: list[str]
) -> None:
    key = await create_creds(client, admin, BODY)
    started = time.monotonic()
    response = await client.patch(
        keys_url(admin, key.id), json={"state": "disabled"}, headers=admin.headers
    )
    took = time.monotonic() - started
    assert (await assert_ok(response))["state"] == "disabled"
    assert took < 1.0, took
    assert holder == ["InsufficientPrivilegeError"] * 3


async def test_a_connect_only_role_cannot_stop_an_instance_from_starting(
    made: dict[str, str], postgres: Postgres, pg_database: str, holder: list[str]
) -> None:
    creds = {"keyId": made["keyId"], "keySecret": made["keySecret"]}
    with Server(postgres.url(pg_database), env=ENV) as server:  # type: ignore[arg-type]
        status, answer = call(server.base, "/v1/whoami", creds)
        assert status == 200, answer
