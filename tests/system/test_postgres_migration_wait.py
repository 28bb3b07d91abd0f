"""A keysvc that starts while another holds the migration's lock (the 'migration' row of
keysvc_locks: another instance migrating, or frozen while it did) gives up within the
stated bound (``MIGRATION_WAIT_SECONDS``) with an error naming the lock, as it does on
the advisory lock of a database without that table, rather than waiting without end."""

import asyncio
import time

import asyncpg
import pytest

from keysvc.config import ConfigError
from keysvc.db.postgres import schema as pgschema
from tests.postgres import Postgres


async def test_a_held_migration_row_ends_the_start_within_the_bound(
    postgres: Postgres, pg_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgschema, "MIGRATION_WAIT_SECONDS", 1.0)
    url = postgres.url(pg_database)
    holder = await asyncpg.connect(url)
    starting = await asyncpg.connect(url)
    try:
        await pgschema.migrate(holder)  # keysvc_locks is there, as after any start
        async with holder.transaction():
            await holder.fetchval(pgschema.TAKE_LOCK, "migration")
            started = time.monotonic()
            with pytest.raises(ConfigError, match="migration lock"):
                await asyncio.wait_for(pgschema.migrate(starting), 20)
            assert time.monotonic() - started < 5
        # Once the row is free, the same start goes through.
        assert await pgschema.migrate(starting) == pgschema.schema_version()
    finally:
        await holder.close()
        await starting.close()


async def test_a_held_advisory_key_ends_the_first_start_within_the_bound(
    postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database keysvc has not made yet (no keysvc_locks): its first migration waits on
    the advisory key any role that may connect can hold, at most the bound."""
    monkeypatch.setattr(pgschema, "MIGRATION_WAIT_SECONDS", 1.0)
    admin = await asyncpg.connect(postgres.url("postgres"))
    name = f"empty_{time.monotonic_ns()}"
    await admin.execute(f'create database "{name}"')
    holder = await asyncpg.connect(postgres.url(name))
    starting = await asyncpg.connect(postgres.url(name))
    try:
        await holder.fetchval("select pg_advisory_lock($1)", pgschema.MIGRATION_LOCK)
        started = time.monotonic()
        with pytest.raises(ConfigError, match="migration lock"):
            await asyncio.wait_for(pgschema.migrate(starting), 20)
        assert time.monotonic() - started < 5
        assert await pgschema.recorded_version(starting) == 0  # nothing half made
        await holder.fetchval("select pg_advisory_unlock($1)", pgschema.MIGRATION_LOCK)
        assert await pgschema.migrate(starting) == 0
        assert await pgschema.recorded_version(starting) == pgschema.schema_version()
    finally:
        await holder.close()
        await starting.close()
        await admin.execute(f'drop database "{name}"')
        await admin.close()
