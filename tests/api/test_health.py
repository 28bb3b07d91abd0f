"""Liveness and readiness need no credentials and answer in the envelope."""

import asyncio
import sqlite3

from keysvc.config import Settings
from keysvc.http.state import STORE
from tests.handsql import hand_sql
from tests.helpers import Client, assert_error, assert_ok


async def test_healthz(client: Client) -> None:
    assert await assert_ok(await client.get("/healthz")) == {"status": "ok"}


async def test_readyz(client: Client) -> None:
    assert await assert_ok(await client.get("/readyz")) == {"status": "ready"}


def _set_user_version(settings: Settings, version: int) -> None:
    raw = sqlite3.connect(settings.db_path)
    try:
        raw.execute(f"pragma user_version = {version}")
    finally:
        raw.close()


async def test_readyz_503_when_schema_is_not_current(client: Client, settings: Settings) -> None:
    if settings.db_url is None:
        # In a thread: the app's start-up upkeep may hold the write lock, and it needs
        # this event loop to let go of it.
        await asyncio.to_thread(_set_user_version, settings, 99)
    else:  # PostgreSQL keeps the version in meta (keysvc.db.postgres.schema)
        hand_sql(settings, "update meta set value = '99' where name = 'schema_version'")
    response = await client.get("/readyz")
    await assert_error(response, 503, "not ready: the database schema is not current")


async def test_readyz_503_when_database_is_gone(client: Client) -> None:
    await client.app[STORE].close()
    response = await client.get("/readyz")
    await assert_error(response, 503, "not ready: the database does not answer")
