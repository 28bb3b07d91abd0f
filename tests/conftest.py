"""The fixtures every API test shares: settings on a temporary database file, a fake
clock, the app from create_app, its client, and the admins of two organizations; and
the session's PostgreSQL server (one per xdist worker), with a fresh database per test.
The markers of what a test needs are given here (``pytest_collection_modifyitems``).
The helpers they use live in tests/helpers.py and tests/postgres.py."""

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from keysvc.config import Settings
from keysvc.http.app import create_app
from keysvc.http.dispatch import DispatchRunner
from tests.helpers import Client, ClientFactory, Creds, FakeClock, bootstrap
from tests.postgres import PEPPER, Postgres, start_postgres, stop_postgres

API_TESTS = Path(__file__).parent / "api"
SYSTEM_TESTS = Path(__file__).parent / "system"
BACKENDS = ("sqlite", "postgres")
# What a test needs, by the fixtures it uses or the module it is in, as a marker that
# -m selects on (registered in pyproject.toml): make test-fast runs none of them.
NEEDS_FIXTURE = {"postgres": "postgres", "pg_database": "postgres", "browser": "browser"}
# System test modules by name (tests/system only: a unit test of the PostgreSQL
# settings needs no server).
NEEDS_MODULE = {
    "postgres": "postgres",  # test_postgres_*.py, test_audit_postgres.py, ...
    "browser": "browser",  # test_*_browser.py
    "nginx": "nginx",  # test_nginx.py, test_postgres_nginx.py
}
# Soak, crash and build tests, and the system tests that take longest.
SLOW_MODULES = {
    "test_soak",
    "test_crash",
    "test_activities_crash",
    "test_webhooks_crash",
    "test_dist",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The API suite runs on both backends: every test under tests/api that uses the
    app gets a ``backend`` of "sqlite" and of "postgres", but a test marked
    ``sqlite_only`` (it is about SQLite's file, its pragmas or its connections)."""
    if "backend" not in metafunc.fixturenames or API_TESTS not in metafunc.definition.path.parents:
        return
    if metafunc.definition.get_closest_marker("sqlite_only") is None:
        metafunc.parametrize("backend", BACKENDS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with what it needs: ``postgres`` (a [postgres] API test, or one using
    the cluster), ``browser`` (Chromium), ``nginx``, and ``slow``. On pytest-xdist's
    workers, the system tests come first (``by_cost``)."""
    _mark_needs(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=by_cost)


def by_cost(item: pytest.Item) -> int:
    """The order of a parallel run: tests/system first, then tests/api, then tests/unit.
    A worker takes a file at a time, in this order, as it finishes the last; the system
    tests hold the longest files (up to 40 s), and one of them taken last would leave the
    other workers idle to the end. A serial run keeps testpaths' order, cheapest first,
    so that a broken unit fails before any server starts. A stable sort: every worker
    collects the same order, as pytest-xdist requires."""
    if SYSTEM_TESTS in item.path.parents:
        return 0
    return 1 if API_TESTS in item.path.parents else 2


def _mark_needs(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        # A backend given as a parameter ([sqlite] or [postgres]), the API's or a fixture's.
        params = list(callspec.params.values()) if callspec is not None else []
        on_sqlite = "sqlite" in params
        needs = {"postgres"} if "postgres" in params else set()
        fixtures = getattr(item, "fixturenames", ())
        needs |= {NEEDS_FIXTURE[name] for name in fixtures if name in NEEDS_FIXTURE}
        module = item.path.stem
        if SYSTEM_TESTS in item.path.parents:
            needs |= {
                marker
                for part, marker in NEEDS_MODULE.items()
                if part in module and not (marker == "postgres" and on_sqlite)
            }
        if module in SLOW_MODULES:
            needs.add("slow")
        for marker in sorted(needs):
            item.add_marker(marker)


@pytest.fixture
def backend() -> str:
    """The backend of a test the API suite does not run twice: SQLite's."""
    return BACKENDS[0]


@pytest.fixture
def settings(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Settings:
    """Settings on this test's own database: a SQLite file, or a fresh PostgreSQL one;
    with the values of the test's ``settings`` marker, if it has one."""
    marker = request.node.get_closest_marker("settings")
    values: dict[str, Any] = {} if marker is None else dict(marker.kwargs)
    if backend == "sqlite":
        return Settings(db_path=tmp_path / "keysvc.db", **values)
    database: str = request.getfixturevalue("pg_database")
    cluster: Postgres = request.getfixturevalue("postgres")
    return Settings(db_url=cluster.url(database), pepper=PEPPER, **values)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(settings: Settings, clock: FakeClock) -> web.Application:
    return create_app(settings, clock=clock)


class DispatchTestServer(TestServer):
    """A test server that answers as ``keysvc serve`` does, through
    ``keysvc.http.dispatch`` (a verify straight to the middleware and view)."""

    async def _make_runner(self, **kwargs: Any) -> DispatchRunner:
        return DispatchRunner(self.app, **kwargs)


@pytest.fixture
def aiohttp_client(aiohttp_client: ClientFactory) -> ClientFactory:
    """pytest-aiohttp's, serving an application as ``keysvc serve`` does
    (``DispatchTestServer``): every test of the app goes through the path it runs."""

    async def make(
        app: Any, *, server_kwargs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Client:
        if isinstance(app, web.Application):
            app = DispatchTestServer(app, **(server_kwargs or {}))
        return await aiohttp_client(app, **kwargs)

    return make


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
