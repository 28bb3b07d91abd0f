"""A PostgreSQL server that refuses keysvc's connections, for each cause a real cluster
of this module's own can be given while an app serves on it: its role may no longer
log in, its database is dropped, its password changed (a wrong one), a pg_hba.conf
rule rejects it. Each is a 503 with Retry-After, as a stopped server is, never a 500
with a traceback."""

import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from keysvc.config import Settings
from keysvc.http.app import create_app
from tests.helpers import Client, ClientFactory, assert_error, bootstrap, keys_url
from tests.pgfaults import module_cluster
from tests.postgres import PEPPER, Postgres

PASSWORD = "right-password"
BODY = {"name": "k", "roles": ["developer"]}


postgres = module_cluster()


@pytest.fixture
def role(postgres: Postgres) -> str:
    """A role of this test's own, whose password the server checks (scram-sha-256)."""
    name = f"svc_{uuid.uuid4().hex[:12]}"
    postgres.psql("postgres", f"create role {name} login superuser password '{PASSWORD}'")
    _hba(postgres, f"host all {name} 127.0.0.1/32 scram-sha-256")
    return name


def _hba(postgres: Postgres, line: str) -> None:
    """``line`` put first in pg_hba.conf, and the server told to read it again."""
    hba = postgres.data / "pg_hba.conf"
    hba.write_text(f"{line}\n{hba.read_text()}")
    postgres.psql("postgres", "select pg_reload_conf()")


@pytest.fixture
async def client(
    postgres: Postgres, pg_database: str, role: str, aiohttp_client: ClientFactory
) -> AsyncIterator[Client]:
    url = f"postgresql://{role}:{PASSWORD}@127.0.0.1:{postgres.port}/{pg_database}"
    started = await aiohttp_client(create_app(Settings(db_url=url, pepper=PEPPER)))
    yield started
    await started.close()


def _no_login(postgres: Postgres, database: str, role: str) -> None:
    postgres.psql("postgres", f"alter role {role} nologin")


def _dropped(postgres: Postgres, database: str, role: str) -> None:
    postgres.psql("postgres", f"drop database {database} with (force)")


def _wrong_password(postgres: Postgres, database: str, role: str) -> None:
    postgres.psql("postgres", f"alter role {role} password 'another-password'")


def _rejected(postgres: Postgres, database: str, role: str) -> None:
    _hba(postgres, f"host all {role} 127.0.0.1/32 reject")


@pytest.mark.parametrize("refuse", [_no_login, _dropped, _wrong_password, _rejected])
async def test_a_database_that_refuses_the_connections_is_503_not_500(
    client: Client,
    postgres: Postgres,
    pg_database: str,
    role: str,
    refuse: Callable[[Postgres, str, str], None],
) -> None:
    admin = await bootstrap(client.app)
    refuse(postgres, pg_database, role)
    postgres.psql(
        "postgres",
        f"select pg_terminate_backend(pid) from pg_stat_activity where usename = '{role}'",
    )
    for _ in range(3):
        for method, body in (("GET", None), ("POST", BODY)):
            response = await client.request(
                method, keys_url(admin), json=body, headers=admin.headers
            )
            await assert_error(response, 503, "database unavailable")
            assert response.headers["Retry-After"] == "5"
    ready = await client.get("/readyz")
    await assert_error(ready, 503, "not ready: the database does not answer")
