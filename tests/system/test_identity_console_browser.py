"""Issue 36: the console's identities page, end to end in a real headless Chromium
driven by Playwright (as tests/system/test_console_browser.py): an identity created in
the page, the keys that belong to it listed, and its credits and rate limits edited,
each as the API then answers. Screenshots go to test-artifacts/console/."""

from collections.abc import Callable

import pytest
from playwright.sync_api import Locator, Page, expect

from tests.console_page import Console, screenshot


def identity_row(page: Page, external_id: str) -> Locator:
    return page.locator("tr", has=page.locator(f"[data-identity='{external_id}']"))


def test_an_identity_is_created_shown_with_its_keys_and_edited(
    open_console: Callable[..., Console], capsys: pytest.CaptureFixture[str]
) -> None:
    console = open_console()
    page = console.page
    page.get_by_role("button", name="Identities", exact=True).click()
    page.get_by_role("button", name="New identity").click()
    dialog = page.locator("dialog")
    dialog.get_by_label("External ID").fill("acme")
    dialog.get_by_label("Credits").fill("100")
    dialog.get_by_role("button", name="Create identity").click()
    row = identity_row(page, "acme")
    expect(row).to_contain_text("100")
    org = f"/v1/organizations/{console.created['organizationId']}"
    status, made = console.api(
        f"{org}/keys", method="POST",
        body={"name": "acme staging", "roles": ["developer"], "externalId": "acme"},
    )  # fmt: skip
    assert status == 200, made
    page.get_by_role("button", name="Identities", exact=True).click()
    identity_row(page, "acme").get_by_role("button", name="Keys").click()
    expect(page.locator("dialog")).to_contain_text("acme staging")
    page.locator("dialog").get_by_role("button", name="Close dialog").click()
    identity_row(page, "acme").get_by_role("button", name="Edit").click()
    dialog = page.locator("dialog")
    dialog.get_by_label("Credits").fill("5")
    dialog.get_by_label("Rate limits").fill(
        '[{"name": "tokens", "limit": 10, "windowSeconds": 60}]'
    )
    dialog.get_by_role("button", name="Save").click()
    row = identity_row(page, "acme")
    expect(row).to_contain_text("tokens: 10/60s")
    expect(row.locator("td").nth(1)).to_have_text("5")
    screenshot(page, "identities-1280.png", capsys)
    status, found = console.api(f"{org}/identities?externalId=acme")
    assert status == 200, found
    (identity,) = found["result"]
    assert identity["credits"]["remaining"] == 5
    assert identity["ratelimits"] == [
        {"name": "tokens", "limit": 10, "windowSeconds": 60, "autoApply": False}
    ]
    assert made["result"]["key"]["identityId"] == identity["id"]
