"""The schema on PostgreSQL (keysvc/schema_postgres.sql, keysvc.db.postgres.schema) against
SQLite's: the same tables and columns, the same version number, and triggers that do
what SQLite's do, on a real PostgreSQL (tests/postgres.py)."""

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from keysvc.config import ConfigError
from keysvc.db.postgres.schema import migrate, recorded_version, schema_is_current
from keysvc.db.sqlite.connections import connect
from keysvc.db.sqlite.migrations import migrate as migrate_sqlite
from keysvc.db.sqlite.migrations import schema_version
from tests.postgres import Postgres

# SQLite's declared type -> PostgreSQL's (information_schema's data_type).
TYPES = {"text": "text", "integer": "bigint", "blob": "bytea", "real": "double precision"}
# SQLite needs it because its shell deletes with foreign keys off; PostgreSQL always
# cascades (schema_postgres.sql's head).
SQLITE_ONLY_TRIGGERS = {"api_keys_roles_dropped"}
POSTGRES_ONLY_TRIGGERS = {"meta_auth_announced"}
# The instances' shared rate counters: SQLite's one instance counts in memory
# (keysvc.domain.sharedlimits); its numbered step there is a no-op. The instances'
# listening connections (keysvc.db.postgres.peers): SQLite's one instance waits for none.
# The rows the writes and migrations lock (keysvc.db.postgres.schema.LOCKS_TABLE):
# SQLite's file lock is its own.
POSTGRES_ONLY_TABLES = {"shared_limits", "listeners", "keysvc_locks"}

ORG = "00000000-0000-4000-8000-000000000001"
ADMIN_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001"
TABLES = "select tablename from pg_tables where schemaname = 'public'"


@pytest.fixture
async def pg(postgres: Postgres, pg_database: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(postgres.url(pg_database))
    yield conn
    await conn.close()


async def sqlite_schema(path: Path) -> tuple[dict[str, list[tuple[str, str, bool]]], set[str]]:
    """Each table's columns (name, PostgreSQL type, not null) and the trigger names of
    a SQLite database keysvc made."""
    conn = await connect(path, create=True)
    try:
        await migrate_sqlite(conn)
        tables = await conn.execute_fetchall(
            "select name from sqlite_master where type = 'table' and name not like 'sqlite_%'"
        )
        columns: dict[str, list[tuple[str, str, bool]]] = {}
        for (table,) in tables:
            info = await conn.execute_fetchall("select * from pragma_table_info(?)", (table,))
            columns[table] = [
                # A primary key column is not null on PostgreSQL whatever it says.
                (row["name"], TYPES[row["type"].lower()], bool(row["notnull"] or row["pk"]))
                for row in info
            ]
        triggers = await conn.execute_fetchall(
            "select name from sqlite_master where type = 'trigger'"
        )
        return columns, {name for (name,) in triggers}
    finally:
        await conn.close()


async def postgres_schema(conn: Any) -> tuple[dict[str, list[tuple[str, str, bool]]], set[str]]:
    rows = await conn.fetch(
        "select table_name, column_name, data_type, is_nullable from information_schema.columns"
        " where table_schema = 'public' order by table_name, ordinal_position"
    )
    columns: dict[str, list[tuple[str, str, bool]]] = {}
    for row in rows:
        columns.setdefault(row["table_name"], []).append(
            (row["column_name"], row["data_type"], row["is_nullable"] == "NO")
        )
    triggers = await conn.fetch(
        "select distinct trigger_name from information_schema.triggers"
        " where trigger_schema = 'public'"
    )
    return columns, {row["trigger_name"] for row in triggers}


async def test_the_tables_and_columns_are_sqlites(pg: Any, tmp_path: Path) -> None:
    sqlite_columns, sqlite_triggers = await sqlite_schema(tmp_path / "keysvc.db")
    pg_columns, pg_triggers = await postgres_schema(pg)
    for table in POSTGRES_ONLY_TABLES:
        del pg_columns[table]
    assert pg_columns == sqlite_columns
    # PostgreSQL announces every table's changes (SQLite's data_version does it there).
    announced = {f"{table}_data_changed" for table in pg_columns}
    assert announced <= pg_triggers
    only = POSTGRES_ONLY_TRIGGERS | announced
    assert pg_triggers - only == sqlite_triggers - SQLITE_ONLY_TRIGGERS


async def test_the_version_is_numbered_as_sqlites(pg: Any) -> None:
    assert await recorded_version(pg) == schema_version()
    assert await schema_is_current(pg)
    # Again on a current database: nothing to do.
    assert await migrate(pg) == schema_version()
    seeded = await pg.fetch("select name from roles where type = 'system' order by name")
    assert [row["name"] for row in seeded] == ["admin", "developer", "query_endpoints"]


async def test_a_newer_database_is_refused(pg: Any) -> None:
    newer = str(schema_version() + 1)
    await pg.execute("update meta set value = $1 where name = 'schema_version'", newer)
    with pytest.raises(ConfigError, match="newer than this keysvc supports"):
        await migrate(pg)


async def test_an_older_database_without_a_step_is_refused_untouched(pg: Any) -> None:
    older = str(schema_version() - 1)
    await pg.execute("update meta set value = $1 where name = 'schema_version'", older)
    with pytest.raises(ConfigError, match="no PostgreSQL step for version"):
        # No steps at all: the latest version may have one (POSTGRES_MIGRATIONS).
        await migrate(pg, steps={})
    assert await recorded_version(pg) == schema_version() - 1


async def test_an_older_database_takes_its_steps(pg: Any) -> None:
    older = str(schema_version() - 1)
    await pg.execute("update meta set value = $1 where name = 'schema_version'", older)
    step = {schema_version(): "create table stepped (n bigint)"}
    assert await migrate(pg, steps=step) == schema_version() - 1
    assert await pg.fetchval("select to_regclass('stepped') is not null")
    assert await schema_is_current(pg)


async def test_an_empty_database_is_refused_without_create(postgres: Postgres) -> None:
    name = postgres.fresh_database(template="template0")
    try:
        conn = await asyncpg.connect(postgres.url(name))
        try:
            with pytest.raises(ConfigError, match="no keysvc schema"):
                await migrate(conn, create=False)
            assert await recorded_version(conn) == 0
        finally:
            await conn.close()
    finally:
        postgres.drop_database(name)


async def test_instances_starting_at_once_make_the_schema_once(postgres: Postgres) -> None:
    name = postgres.fresh_database(template="template0")
    try:
        conns = [await asyncpg.connect(postgres.url(name)) for _ in range(4)]
        try:
            found = await asyncio.gather(*(migrate(conn) for conn in conns))
            assert sorted(found) == [0, *[schema_version()] * 3]
            assert await schema_is_current(conns[0])
        finally:
            for conn in conns:
                await conn.close()
    finally:
        postgres.drop_database(name)


async def generation(conn: Any) -> int:
    return int(await conn.fetchval("select value from meta where name = 'auth_generation'"))


async def insert_key(conn: Any, key_id: str, key_id_hash: bytes, org_seq: int) -> None:
    await conn.execute(
        "insert into api_keys (id, organization_id, name, state, key_id_hash, secret_hash,"
        " key_suffix, created_at, org_seq) values ($1, $2, 'k', 'enabled', $3, $4, 'abcd',"
        " '2026-01-01T00:00:00Z', $5)",
        key_id,
        ORG,
        key_id_hash,
        b"secret",
        org_seq,
    )


async def test_the_triggers_do_what_sqlites_do(pg: Any) -> None:
    await pg.execute(
        "insert into organizations (id, name, created_at) values ($1, 'acme', '2026')", ORG
    )
    await insert_key(pg, "k1", b"h1", 1)
    await insert_key(pg, "k2", b"h2", 2)
    counted = await pg.fetchrow(
        "select key_count, last_key_seq from organizations where id = $1", ORG
    )
    assert tuple(counted) == (2, 2)

    # usedAt alone leaves the generation; what a key may do moves it.
    before = await generation(pg)
    await pg.execute("update api_keys set used_at = '2026-01-02T00:00:00Z' where id = 'k1'")
    assert await generation(pg) == before
    await pg.execute("update api_keys set state = 'disabled' where id = 'k1'")
    assert await generation(pg) == before + 1
    await pg.execute("insert into key_roles (key_id, role_id) values ('k1', $1)", ADMIN_ROLE)
    assert await generation(pg) == before + 2

    # A replaced key ID is taken by no new key.
    await pg.execute("update api_keys set previous_key_id_hash = 'old'::bytea where id = 'k2'")
    assert await generation(pg) == before + 3
    with pytest.raises(asyncpg.UniqueViolationError, match="previous key ID"):
        await insert_key(pg, "k3", b"old", 3)

    # A delete takes the key's roles and usage counts, and the count goes down.
    await pg.execute("insert into key_usage (key_id, minute, success) values ('k1', 'm', 1)")
    await pg.execute("delete from api_keys where id = 'k1'")
    assert await generation(pg) == before + 5  # the key, and its role row
    assert await pg.fetchval("select count(*) from key_usage") == 0
    assert await pg.fetchval("select count(*) from key_roles") == 0
    counted = await pg.fetchrow(
        "select key_count, last_key_seq from organizations where id = $1", ORG
    )
    assert tuple(counted) == (1, 2)


async def test_a_generation_move_is_announced_at_commit(postgres: Postgres, pg: Any) -> None:
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(postgres.url(await pg.fetchval("select current_database()")))
    try:
        await listener.add_listener("keysvc_auth", lambda *args: heard.put_nowait(args[3]))
        async with pg.transaction():
            await pg.execute("update roles set name = name where id = $1", ADMIN_ROLE)
            moved = await generation(pg)
            await asyncio.sleep(0.2)
            assert heard.empty(), "announced before the commit"
        assert await asyncio.wait_for(heard.get(), timeout=30) == str(moved)
    finally:
        await listener.close()


async def test_step_12_makes_a_database_at_11_announce_changes_by_hand(
    pg: Any, postgres: Postgres, pg_database: str
) -> None:
    """A database made before the data triggers (version 11) gets them from its step,
    and then a change by hand on any table is heard on keysvc_data."""
    names = await pg.fetch("select tgname from pg_trigger where tgname like '%_data_changed'")
    for (name,) in names:
        table = name.removesuffix("_data_changed")
        await pg.execute(f'drop trigger "{name}" on "{table}"')
    await pg.execute("update meta set value = '11' where name = 'schema_version'")
    assert await migrate(pg) == 11 and await schema_is_current(pg)
    again = await pg.fetch("select tgname from pg_trigger where tgname like '%_data_changed'")
    tables = {row[0] for row in await pg.fetch(TABLES)} - POSTGRES_ONLY_TABLES
    assert len(names) == len(again) == len(tables)
    heard: asyncio.Queue[str] = asyncio.Queue()
    await pg.add_listener("keysvc_data", lambda *args: heard.put_nowait(args[2]))
    other = await asyncpg.connect(postgres.url(pg_database))
    try:
        await other.execute("update roles set updated_at = updated_at where type = 'system'")
    finally:
        await other.close()
    assert await asyncio.wait_for(heard.get(), 10) == "keysvc_data"
