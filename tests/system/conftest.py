"""The fixtures of the browser tests of the console: a real server (a module's own,
or a test's own), Debian's Chromium under Playwright, and consoles opened on them that
fail their test if their page logged an error. Their helpers are tests/console_page.py.
And ``db``: a new database on each backend, for the operator's commands (import,
export), as a file's path or a PostgreSQL URL."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ViewportSize, expect, sync_playwright

from tests.components import require_command
from tests.console_page import WIDE, Console, Running
from tests.postgres import Postgres
from tests.server import Server, bootstrap

# Usage counts written each second: a test sees its requests in the chart soon.
SERVE_ARGS = ("--usage-flush-seconds", "1")


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "keysvc.db")
    postgres: Postgres = request.getfixturevalue("postgres")
    return postgres.url(request.getfixturevalue("pg_database"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    db = tmp_path_factory.mktemp("console") / "k.db"
    created = bootstrap(db)
    with Server(db, args=SERVE_ARGS) as running:
        yield running, created


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = require_command("chromium", package="chromium")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
        )
        yield launched
        launched.close()


@pytest.fixture
def open_console(browser: Browser, server: Running) -> Iterator[Callable[..., Console]]:
    """Opens consoles; each is closed after the test, which fails if its page logged
    an error."""
    opened: list[Console] = []

    def open_one(
        viewport: ViewportSize = WIDE, *, signed_in: bool = True, on: Running | None = None
    ) -> Console:
        console = Console(browser, on or server, viewport)
        opened.append(console)
        if signed_in:
            console.sign_in()
            expect(console.page.get_by_role("heading", name="Keys", exact=True)).to_be_visible()
        return console

    yield open_one
    for console in opened:
        console.context.close()
        assert console.problems == []


@pytest.fixture
def other_server(tmp_path: Path) -> Iterator[Running]:
    """A server of its own, for a test that fills its organization or rotates the admin key."""
    db = tmp_path / "k.db"
    created = bootstrap(db)
    with Server(db, args=SERVE_ARGS) as running:
        yield running, created
