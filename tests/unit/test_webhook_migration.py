"""The webhook tables' migration step: on a database without them it makes, with the
steps after it, what schema.sql makes (tables, indexes, their columns and
constraints), so that an upgraded database and a new one hold the same outbox."""

import re
import sqlite3
from pathlib import Path

from keysvc.db.sqlite import migrations

TABLES = ("webhooks", "webhook_deliveries", "webhook_attempts", "webhook_expiry_warnings")


def _shape(conn: sqlite3.Connection) -> dict[str, str]:
    """Each webhook table's and index's SQL, whitespace and comments taken out (and the
    spaces around punctuation, where ``alter table add column`` writes its own)."""
    rows = conn.execute(
        "select name, sql from sqlite_master where tbl_name in (?, ?, ?, ?) and sql is not null",
        TABLES,
    )
    return {name: _squeezed(sql) for name, sql in rows}


def _squeezed(sql: str) -> str:
    spaced = re.sub(r"\s+", " ", re.sub(r"--[^\n]*", "", sql)).strip()
    return re.sub(r" ?([,()]) ?", r"\1", spaced)


def test_the_step_makes_what_schema_sql_makes(tmp_path: Path) -> None:
    (step,) = [s for s in migrations.MIGRATIONS if "create table if not exists webhooks" in s]
    fresh = sqlite3.connect(tmp_path / "fresh.db")
    fresh.executescript(migrations.schema_sql())
    upgraded = sqlite3.connect(tmp_path / "upgraded.db")
    upgraded.executescript(migrations.schema_sql())
    for table in reversed(TABLES):
        upgraded.execute(f"drop table {table}")
    assert _shape(upgraded) == {}
    # The step, then every step after it, as an upgrade runs them: the later ones that
    # change these tables too (outbox MACs, bound secrets, unique nonces; fair delivery's
    # indexes; the waiting deliveries' index).
    # Steps that touch none of them are left out: run again on schema.sql's own tables,
    # an ``alter table ... add column`` would fail.
    for later in migrations.MIGRATIONS[migrations.MIGRATIONS.index(step) :]:
        if any(table in later for table in TABLES):
            upgraded.executescript(later)
    made = _shape(upgraded)
    assert set(made) >= set(TABLES)
    assert made == _shape(fresh)
