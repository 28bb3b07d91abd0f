"""Storage without the app: pragmas, migrations from every older schema, and the
pepper."""

import os
import sqlite3
import stat
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from keysvc.config import ConfigError
from keysvc.credentials import load_pepper
from keysvc.db.core import UsageUpkeep
from keysvc.db.sqlite import connections, migrations
from keysvc.db.sqlite.store import Store


async def test_pragmas(tmp_path: Path) -> None:
    conn = await connections.connect(tmp_path / "p.db")
    try:
        values = {}
        for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout"):
            async with conn.execute(f"pragma {name}") as cursor:
                row = await cursor.fetchone()
                assert row is not None
                values[name] = row[0]
    finally:
        await conn.close()
    assert values == {
        "journal_mode": "wal",
        "synchronous": 2,
        "foreign_keys": 1,
        "busy_timeout": 5000,
    }


async def test_fresh_database_gets_current_schema(tmp_path: Path) -> None:
    conn = await connections.connect(tmp_path / "m.db")
    try:
        assert await migrations.migrate(conn) == 0
        assert (
            await migrations.migrate(conn) == migrations.schema_version()
        )  # a second start changes nothing
    finally:
        await conn.close()
    raw = sqlite3.connect(tmp_path / "m.db")
    assert raw.execute("pragma user_version").fetchone()[0] == migrations.schema_version()
    tables = {r[0] for r in raw.execute("select name from sqlite_master where type = 'table'")}
    assert {"organizations", "roles", "api_keys", "key_roles", "meta"} <= tables


async def test_older_database_is_upgraded_in_one_step(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = await connections.connect(path)
    await migrations.migrate(conn)
    current = migrations.schema_version()
    steps = [
        *migrations.MIGRATIONS,
        "alter table organizations add column note text;",
        "create table extra (x integer);",
    ]
    assert await migrations.migrate(conn, steps) == current
    await conn.close()
    raw = sqlite3.connect(path)
    assert raw.execute("pragma user_version").fetchone()[0] == current + 2
    raw.execute("select note from organizations").fetchall()
    raw.execute("select x from extra").fetchall()


def version_1(path: Path) -> sqlite3.Connection:
    """A connection to a new database at ``path`` as the first release made it (schema v1)."""
    raw = sqlite3.connect(path)
    raw.executescript((Path(__file__).parents[1] / "data" / "schema_v1.sql").read_text())
    raw.execute("pragma user_version = 1")
    return raw


def legacy_key(raw: sqlite3.Connection, key_id: str, org: str, id_hash: bytes) -> None:
    """A key row as the first release stored it, enabled, named legacy."""
    raw.execute(
        "insert into api_keys (id, organization_id, name, state, key_id_hash, secret_hash,"
        " key_suffix, created_at) values (?, ?, 'legacy', 'enabled', ?, x'02', 'abcd',"
        " '2026-01-01T00:00:00Z')",
        (key_id, org, id_hash),
    )


async def test_upgrade_numbers_each_organizations_keys_apart(tmp_path: Path) -> None:
    """Step 5 gives each existing key its place in its own organization, in creation
    order, whatever other organizations created in between; new keys continue it."""
    path = tmp_path / "v1.db"
    raw = version_1(path)
    orgs = ["11111111-1111-4111-8111-111111111111", "33333333-3333-4333-8333-333333333333"]
    for org in orgs:
        raw.execute("insert into organizations values (?, 'old', '2026-01-01T00:00:00Z')", (org,))
    made: dict[str, list[str]] = {org: [] for org in orgs}
    for n, org in enumerate([orgs[0], orgs[1], orgs[1], orgs[0], orgs[1], orgs[0]]):
        key_id = str(uuid.uuid4())
        legacy_key(raw, key_id, org, bytes([n]))
        made[org].append(key_id)
    raw.commit()
    raw.close()
    store = await Store.open(path)
    try:
        for org in orgs:
            page = await store.list_keys(org, 0, 10)
            assert [(key.id, key.org_seq) for key in page.keys] == [
                (key_id, n) for n, key_id in enumerate(made[org], 1)
            ]
            assert [key.id for key in (await store.list_keys(org, 2, 10)).keys] == made[org][2:]
    finally:
        await store.close()
    upgraded = sqlite3.connect(path)
    assert upgraded.execute("select last_key_seq from organizations").fetchall() == [(3,), (3,)]


async def test_version_1_database_upgrades_with_its_data(tmp_path: Path) -> None:
    """A database made by the first release (schema v1) opens, upgrades, keeps its keys."""
    path = tmp_path / "v1.db"
    raw = version_1(path)
    org = "11111111-1111-4111-8111-111111111111"
    raw.execute("insert into organizations values (?, 'old', '2026-01-01T00:00:00Z')", (org,))
    legacy_key(raw, "22222222-2222-4222-8222-222222222222", org, b"\x01")
    raw.commit()
    raw.close()
    store = await Store.open(path)
    try:
        key = await store.get_key(org, "22222222-2222-4222-8222-222222222222")
        assert key is not None and key.name == "legacy" and key.rate_limit is None
        assert await store.schema_is_current()
    finally:
        await store.close()
    upgraded = sqlite3.connect(path)
    assert upgraded.execute("pragma user_version").fetchone()[0] == migrations.schema_version()
    assert upgraded.execute("select value from meta where name = 'auth_generation'").fetchone()
    # Step 3 counted the organization's keys, and its triggers keep counting.
    assert upgraded.execute("select key_count from organizations").fetchone() == (1,)
    # Step 4's triggers: a key changed by hand moves the authorization generation.
    generation = "select cast(value as integer) from meta where name = 'auth_generation'"
    (before,) = upgraded.execute(generation).fetchone()
    upgraded.execute("update api_keys set state = 'disabled'")
    assert upgraded.execute(generation).fetchone() == (before + 1,)


async def test_upgrade_drops_role_rows_a_hand_delete_left(tmp_path: Path) -> None:
    """Step 6: role rows of a key deleted by hand with foreign keys off (so without
    their cascade) are removed, and the rows of keys that exist are kept."""
    path = tmp_path / "v1.db"
    raw = version_1(path)
    org = "11111111-1111-4111-8111-111111111111"
    raw.execute("insert into organizations values (?, 'old', '2026-01-01T00:00:00Z')", (org,))
    kept, gone = "22222222-2222-4222-8222-222222222222", "44444444-4444-4444-8444-444444444444"
    for n, key_id in enumerate((kept, gone)):
        legacy_key(raw, key_id, org, bytes([n]))
        raw.execute(
            "insert into key_roles values (?, '0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002')", (key_id,)
        )
    raw.execute("delete from api_keys where id = ?", (gone,))  # foreign keys are off here
    raw.commit()
    assert raw.execute("select count(*) from key_roles").fetchone()[0] == 2
    raw.close()
    store = await Store.open(path)
    await store.close()
    upgraded = sqlite3.connect(path)
    assert upgraded.execute("select key_id from key_roles").fetchall() == [(kept,)]
    assert upgraded.execute("pragma foreign_key_check").fetchall() == []


async def test_failed_migration_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.db"
    conn = await connections.connect(path)
    await migrations.migrate(conn)
    with pytest.raises(sqlite3.OperationalError):
        await migrations.migrate(
            conn, [*migrations.MIGRATIONS, "create table half (x integer);", "this is not sql;"]
        )
    await conn.close()
    raw = sqlite3.connect(path)
    assert raw.execute("pragma user_version").fetchone()[0] == migrations.schema_version()
    assert raw.execute("select count(*) from sqlite_master where name = 'half'").fetchone()[0] == 0


async def test_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    sqlite3.connect(path).execute("pragma user_version = 99")
    conn = await connections.connect(path)
    try:
        with pytest.raises(ConfigError, match="newer than this keysvc supports"):
            await migrations.migrate(conn)
    finally:
        await conn.close()


def test_pepper_file_created_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "k.db.pepper"
    first = load_pepper(None, path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(first) >= 32
    assert load_pepper(None, path) == first
    assert load_pepper(b"x" * 40, path) == b"x" * 40


async def test_wrong_pepper_is_refused(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "k.db")
    try:
        await store.check_pepper("one")
        await store.check_pepper("one")
        with pytest.raises(ConfigError, match="pepper does not match"):
            await store.check_pepper("two")
    finally:
        await store.close()


async def test_upkeep_waits_for_the_peppers_keys(tmp_path: Path) -> None:
    """The upkeep's first prune runs at once and writes MACs: started before the pepper
    keyed the chain and the outbox, it failed and waited an hour for its next round."""
    store = await Store.open(tmp_path / "k.db")
    upkeep = UsageUpkeep(60.0, timedelta(days=30), timedelta(days=5))
    try:
        with pytest.raises(RuntimeError, match="once the pepper has keyed"):
            await store.start_upkeep(upkeep)
        store.key_outbox(b"o" * 32)
        with pytest.raises(RuntimeError, match="once the pepper has keyed"):
            await store.start_upkeep(upkeep)
        await store.key_activities(b"a" * 32)
        await store.start_upkeep(upkeep)
    finally:
        await store.close()
