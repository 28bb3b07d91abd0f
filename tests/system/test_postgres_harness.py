"""The PostgreSQL harness (tests/postgres.py): a real server from Debian's packages,
run by an unprivileged user, listening on loopback only, with a database per test
that starts as the template and keeps nothing from another test."""

import os
import pwd
import socket

import pytest

from tests.components import unprivileged
from tests.postgres import TEMPLATE, Postgres

# The two tests below share the session's cluster; whichever runs second finds no
# trace of the first's table in its own database.
MARKER_TABLE = "left_by_a_test"


def test_the_server_runs_unprivileged_on_loopback(postgres: Postgres) -> None:
    owner = (postgres.data / "postmaster.pid").stat().st_uid
    if unprivileged():
        assert owner != 0
        assert pwd.getpwuid(owner).pw_name == "nobody"
    else:
        assert owner == os.geteuid()
    assert postgres.psql("postgres", "show listen_addresses") == [["127.0.0.1"]]
    assert postgres.psql("postgres", "show fsync") == [["off"]]
    with socket.create_connection(("127.0.0.1", postgres.port), timeout=10):
        pass
    assert (postgres.socket_dir / f".s.PGSQL.{postgres.port}").is_socket()


@pytest.mark.parametrize("turn", ["first", "second"])
def test_each_test_has_a_fresh_database(postgres: Postgres, pg_database: str, turn: str) -> None:
    assert pg_database != TEMPLATE
    found = postgres.psql(pg_database, f"select to_regclass('{MARKER_TABLE}') is null")
    assert found == [["t"]], f"the {turn} test found another test's table"
    postgres.psql(pg_database, f"create table {MARKER_TABLE} (n integer)")
    assert postgres.psql(TEMPLATE, f"select to_regclass('{MARKER_TABLE}') is null") == [["t"]]
    assert postgres.url(pg_database).endswith(f"@127.0.0.1:{postgres.port}/{pg_database}")
