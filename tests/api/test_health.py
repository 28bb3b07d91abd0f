"""Liveness and readiness need no credentials and answer in the envelope."""

import sqlite3

from keysvc.config import Settings
from keysvc.http.state import STORE
from tests.handsql import hand_sql
from tests.helpers import Client, assert_error, assert_ok


async def test_healthz(client: Client) -> None:
    assert await assert_ok(await client.get("/healthz")) == {"status": "ok"}


async def test_readyz(client: Client) -> None:
    assert await assert_ok(await client.get("/readyz")) == {"status": "ready"}


async def test_readyz_503_when_schema_is_not_current(client: Client, settings: Settings) -> None:
    if settings.db_url is None:
        raw = sqlite3.connect(settings.db_path)
        raw.execute("pragma user_version = 99")
        raw.close()
    else:  # PostgreSQL keeps the version in meta (keysvc.db.postgres.schema)
        hand_sql(settings, "update meta set value = '99' where name = 'schema_version'")
    response = await client.get("/readyz")
    await assert_error(response, 503, "not ready: the database schema is not current")


async def test_readyz_503_when_database_is_gone(client: Client) -> None:
    await client.app[STORE].close()
    response = await client.get("/readyz")
    await assert_error(response, 503, "not ready: the database does not answer")
