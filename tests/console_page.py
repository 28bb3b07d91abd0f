"""The console at /console in a real Chromium, for the browser tests
(tests/system/test_console*_browser.py): a page in its own browser context with what
it logged, the API beside it, screenshots into test-artifacts/console/ (gitignored),
and the steps several tests take in the page."""

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    Locator,
    Page,
    ViewportSize,
    expect,
)

from tests.server import Server, admin_creds, call

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "console"
WIDE = ViewportSize(width=1280, height=900)
NARROW = ViewportSize(width=390, height=844)
# Chromium's own line for any answer that is not 2xx; the page shows those itself.
FAILED_LOAD = "Failed to load resource"
TIMEOUT_MS = 30_000

Running = tuple[Server, dict[str, Any]]


def creds(key_id: str, secret: str) -> dict[str, str]:
    return {"keyId": key_id, "keySecret": secret}


class Console:
    """/console in a fresh browser context, what its page logged, and the API beside it
    with the admin key."""

    def __init__(self, browser: Browser, running: Running, viewport: ViewportSize):
        self.server, self.created = running
        self.admin = admin_creds(self.created)
        # UTC: the expiry typed in the page's local time is the one the API keeps.
        self.context = browser.new_context(viewport=viewport, timezone_id="UTC")
        self.context.set_default_timeout(TIMEOUT_MS)
        expect.set_options(timeout=TIMEOUT_MS)
        self.page: Page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        self.page.goto(self.server.base + "/console")

    def _console(self, message: ConsoleMessage) -> None:
        if message.type in ("error", "warning") and FAILED_LOAD not in message.text:
            self.problems.append(f"{message.type}: {message.text}")

    def sign_in(self, secret: str | None = None, key_id: str | None = None) -> None:
        """Sign in with the admin key, or with ``key_id`` (default: the admin's) and
        ``secret``."""
        self.page.get_by_label("Key ID").fill(key_id or self.admin.key_id)
        self.page.get_by_label("Secret").fill(secret or self.admin.secret)
        self.page.get_by_role("button", name="Sign in").click()

    def api(
        self,
        path: str,
        pair: dict[str, str] | None = None,
        method: str = "GET",
        body: dict[str, Any] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Call ``path`` (under the organization when it starts with /keys, /roles or
        /activities), with the admin key unless ``pair`` is given."""
        if path.startswith(("/keys", "/roles", "/activities")):
            path = f"/v1/organizations/{self.created['organizationId']}{path}"
        pair = pair or creds(self.admin.key_id, self.admin.secret)
        return call(self.server.base, path, pair, method, body)


def screenshot(page: Page, name: str, capsys: pytest.CaptureFixture[str]) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    with capsys.disabled():
        print(f"\nscreenshot: {path}")
    assert path.stat().st_size > 0
    return path


def key_row(page: Page, name: str) -> Locator:
    return page.get_by_role("button", name=name, exact=True)


def role_row(page: Page, name: str) -> Locator:
    return page.locator("tr", has=page.locator(f"[data-role='{name}']"))


def create_key_in_page(page: Page, name: str, *, hash_data: bool = False) -> tuple[str, str]:
    """Create a key with the developer role through the form; the key ID and secret
    the page shows once."""
    page.get_by_role("button", name="New key").click()
    dialog = page.locator("dialog")
    dialog.get_by_label("Name").fill(name)
    dialog.get_by_label("developer").check()
    if hash_data:
        dialog.get_by_label("hashData").check()
    dialog.get_by_role("button", name="Create key").click()
    expect(page.locator("dialog.secret")).to_contain_text("shown this once")
    return page.locator("#new-key-id").inner_text(), page.locator("#new-key-secret").inner_text()


def create_role_in_page(page: Page, name: str, permission: str, other: str = "") -> None:
    page.get_by_role("button", name="Roles", exact=True).click()
    page.get_by_role("button", name="New role").click()
    dialog = page.locator("dialog")
    dialog.get_by_label("Name").fill(name)
    dialog.get_by_label(permission).check()
    dialog.get_by_label("Other permissions").fill(other)
    dialog.get_by_role("button", name="Create role").click()
    expect(role_row(page, name)).to_contain_text(permission)


def act_on_key(page: Page, name: str, action: str) -> None:
    """Open the key's details and press one of its actions."""
    page.get_by_role("button", name="Keys", exact=True).click()
    key_row(page, name).click()
    page.locator("dialog").get_by_role("button", name=action, exact=True).click()
