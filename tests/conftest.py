"""The fixtures every API test shares: settings on a temporary database file, a fake
clock, the app from create_app, its client, and the admins of two organizations; and
the session's PostgreSQL server, with a fresh database per test. The helpers they use
live in tests/helpers.py and tests/postgres.py."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from keysvc.config import Settings
from keysvc.http.app import create_app
from tests.helpers import Client, ClientFactory, Creds, FakeClock, bootstrap
from tests.postgres import PEPPER, Postgres, start_postgres, stop_postgres

API_TESTS = Path(__file__).parent / "api"
BACKENDS = ("sqlite", "postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The API suite runs on both backends: every test under tests/api that uses the
    app gets a ``backend`` of "sqlite" and of "postgres", but a test marked
    ``sqlite_only`` (it is about SQLite's file, its pragmas or its connections)."""
    if "backend" not in metafunc.fixturenames or API_TESTS not in metafunc.definition.path.parents:
        return
    if metafunc.definition.get_closest_marker("sqlite_only") is None:
        metafunc.parametrize("backend", BACKENDS)


@pytest.fixture
def backend() -> str:
    """The backend of a test the API suite does not run twice: SQLite's."""
    return BACKENDS[0]


@pytest.fixture
def settings(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    """Settings on this test's own database: a SQLite file, or a fresh PostgreSQL one."""
    if backend == "sqlite":
        return Settings(db_path=tmp_path / "keysvc.db")
    database: str = request.getfixturevalue("pg_database")
    cluster: Postgres = request.getfixturevalue("postgres")
    return Settings(db_url=cluster.url(database), pepper=PEPPER)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(settings: Settings, clock: FakeClock) -> web.Application:
    return create_app(settings, clock=clock)


@pytest.fixture
async def client(app: web.Application, aiohttp_client: ClientFactory) -> AsyncIterator[Client]:
    started = await aiohttp_client(app)
    yield started
    await started.close()


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
    postgres.retire(name)
