"""A login role that may CONNECT to keysvc's database and CREATE in its ``public``
schema (PostgreSQL 14's defaults for PUBLIC, kept by every database pg_upgrade brought
from 14) makes keysvc's lock table before keysvc's first start, or before its upgrade
to a version with that table: ``create table if not exists`` would keep hers, and she
could then hold keysvc's write lock for ever (every write, revocations included, a 503
after 15 s; no instance starting). keysvc refuses to start on a table of its schema
that another role owns, and says which and whose."""

from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from tests.pgfaults import login_role
from tests.postgres import PEPPER, Postgres
from tests.server import keysvc

ENV = {"KEYSVC_PEPPER": PEPPER.hex()}


mallory = login_role()


@pytest.fixture
def empty_database(postgres: Postgres) -> Iterator[str]:
    """A database keysvc has not made, with PostgreSQL 14's CREATE on public for PUBLIC."""
    name = postgres.fresh_database("template0")
    postgres.psql(name, "grant create on schema public to public")
    yield name
    postgres.retire(name)


@pytest.fixture
async def squatted(postgres: Postgres, empty_database: str, mallory: str) -> AsyncIterator[str]:
    """Mallory's own keysvc_locks in the empty database, open to everyone."""
    url = f"postgresql://{mallory}@127.0.0.1:{postgres.port}/{empty_database}"
    conn = await asyncpg.connect(url)
    await conn.execute(
        'create table keysvc_locks (name text collate "C" primary key);'
        " insert into keysvc_locks values ('write'), ('migration');"
        " grant all on keysvc_locks to public"
    )
    yield mallory
    await conn.execute("drop table keysvc_locks")  # so that her role can be dropped
    await conn.close()


@pytest.mark.parametrize("command", ["bootstrap", "serve"])
def test_keysvc_refuses_a_lock_table_another_role_made_first(
    postgres: Postgres, empty_database: str, squatted: str, command: str
) -> None:
    url = postgres.url(empty_database)
    if command == "serve":
        done = keysvc("serve", "--db", url, "--port", "0", env=ENV)
    else:
        done = keysvc("bootstrap", "--db", url, env=ENV)
    assert done.returncode != 0, done.stdout
    assert f"keysvc_locks is owned by {squatted}" in done.stderr, done.stderr[-2000:]
    owners = postgres.psql(
        empty_database, "select count(*) from pg_tables where tablename = 'api_keys'"
    )
    assert owners == [["0"]]  # nothing of keysvc's was made beside hers
