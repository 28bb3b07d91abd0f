"""``keysvc migrate``'s table list against the schema: every table schema.sql makes is
copied (a new table fails here until the copy knows it), and each after the tables
its foreign keys name, so that the copy can fill them in that order."""

import re
import sqlite3

from keysvc.db.postgres.fromsqlite import TABLES
from keysvc.db.postgres.schema import postgres_schema_sql
from keysvc.db.sqlite.migrations import schema_sql


def _sqlite_schema() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.executescript(schema_sql())
    return conn


def test_every_table_of_both_schemas_is_copied_once() -> None:
    conn = _sqlite_schema()
    names = "select name from sqlite_master where type = 'table' and name not like 'sqlite_%'"
    sqlite_tables = {row[0] for row in conn.execute(names)}
    postgres_tables = set(re.findall(r"create table if not exists (\w+)", postgres_schema_sql()))
    assert len(TABLES) == len(set(TABLES))
    assert set(TABLES) == sqlite_tables == postgres_tables


def test_each_table_comes_after_the_tables_it_references() -> None:
    conn = _sqlite_schema()
    for place, table in enumerate(TABLES):
        parents = {
            row[2] for row in conn.execute("select * from pragma_foreign_key_list(?)", (table,))
        }
        assert parents <= set(TABLES[:place]), table
