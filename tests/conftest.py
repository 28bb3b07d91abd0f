"""The fixtures every API test shares: settings on a temporary database file, a fake
clock, the app from create_app, its client, and the admins of two organizations; and
the session's PostgreSQL server, with a fresh database per test. The helpers they use
live in tests/helpers.py and tests/postgres.py."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from keysvc.app import create_app
from keysvc.config import Settings
from tests.helpers import Client, ClientFactory, Creds, FakeClock, bootstrap
from tests.postgres import Postgres, start_postgres, stop_postgres


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(db_path=tmp_path / "keysvc.db")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(settings: Settings, clock: FakeClock) -> web.Application:
    return create_app(settings, clock=clock)


@pytest.fixture
async def client(aiohttp_client: ClientFactory, app: web.Application) -> Client:
    return await aiohttp_client(app)


@pytest.fixture
async def admin(client: Client) -> Creds:
    return await bootstrap(client.app)


@pytest.fixture
async def other_admin(client: Client) -> Creds:
    """The admin of a second organization."""
    return await bootstrap(client.app, "other")


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """The session's PostgreSQL cluster, started on first use (tests/postgres.py)."""
    cluster = start_postgres()
    yield cluster
    stop_postgres(cluster)


@pytest.fixture
def pg_database(postgres: Postgres) -> Iterator[str]:
    """The name of a database of this test's own, copied from the template."""
    name = postgres.fresh_database()
    yield name
    postgres.drop_database(name)
