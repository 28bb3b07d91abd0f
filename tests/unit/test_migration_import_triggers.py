"""The import triggers' step (issue 37, round 3): a database of the first release,
upgraded through every step, holds the three row triggers an import's batch stands
aside exactly as schema.sql makes them (each with its ``when`` on meta's
'bulk_insert' row), and they fire for each row there as before."""

import re
import sqlite3
from pathlib import Path

import pytest

from keysvc.db.sqlite import migrations

TRIGGERS = ("api_keys_counted", "key_roles_granted", "api_keys_key_id_not_previous")
ORG = "11111111-1111-4111-8111-111111111111"


def _triggers(conn: sqlite3.Connection) -> dict[str, str]:
    rows = conn.execute(
        "select name, sql from sqlite_master where type = 'trigger' and name in (?, ?, ?)",
        TRIGGERS,
    )
    return {name: re.sub(r"\s+", " ", sql) for name, sql in rows}


def _upgraded(path: Path) -> sqlite3.Connection:
    """A database of schema v1 (tests/data/schema_v1.sql) taken through every step."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript((Path(__file__).parents[1] / "data" / "schema_v1.sql").read_text())
    conn.executescript("\n".join(migrations.MIGRATIONS))
    return conn


def _generation(conn: sqlite3.Connection) -> int:
    return int(conn.execute("select value from meta where name = 'auth_generation'").fetchone()[0])


def test_an_upgraded_database_has_the_triggers_schema_sql_makes(tmp_path: Path) -> None:
    fresh = sqlite3.connect(tmp_path / "fresh.db")
    fresh.executescript(migrations.schema_sql())
    upgraded = _upgraded(tmp_path / "old.db")
    assert _triggers(upgraded) == _triggers(fresh)
    assert len(_triggers(fresh)) == 3
    for sql in _triggers(fresh).values():
        assert "when not exists (select 1 from meta where name = 'bulk_insert')" in sql
    # The step is the last one, and PostgreSQL numbers a version for it too.
    assert migrations.MIGRATIONS[-1] == migrations.BULK_INSERT_STEP


def test_the_triggers_fire_for_each_row_without_the_batchs_row(tmp_path: Path) -> None:
    conn = _upgraded(tmp_path / "old.db")
    conn.execute("insert into organizations (id, name, created_at) values (?, 'o', 'now')", (ORG,))
    generation = _generation(conn)
    insert = (
        "insert into api_keys (id, organization_id, name, state, key_id_hash, secret_hash,"
        " key_suffix, created_at, org_seq)"
        " values (?, ?, 'k', 'enabled', ?, x'02', 'abcd', 'now', ?)"
    )
    conn.execute(insert, ("k1", ORG, b"\x01", 1))
    conn.execute(
        "insert into roles (id, name, type, permissions, created_at, updated_at)"
        " values ('r1', 'reader', 'system', '[]', 'now', 'now')"
    )
    conn.execute("insert into key_roles (key_id, role_id) values ('k1', 'r1')")
    assert conn.execute("select key_count, last_key_seq from organizations").fetchone() == (1, 1)
    assert _generation(conn) == generation + 1
    conn.execute("update api_keys set previous_key_id_hash = x'09' where id = 'k1'")
    with pytest.raises(sqlite3.IntegrityError, match="another key's previous key ID"):
        conn.execute(insert, ("k2", ORG, b"\x09", 2))
    # Inside a transaction that holds the row, they stand aside.
    conn.execute("begin")
    conn.execute("insert into meta (name, value) values ('bulk_insert', '1')")
    conn.execute(insert, ("k3", ORG, b"\x03", 3))
    assert conn.execute("select key_count, last_key_seq from organizations").fetchone() == (1, 1)
    conn.execute("rollback")
