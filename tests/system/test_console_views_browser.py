"""The console's views of rotation, the activity log and usage, end to end in a real
headless Chromium driven by Playwright (as tests/system/test_console_browser.py).

A key rotated in the page with a grace period: the new pair the page shows once works
against the API, and so does the old one during the grace, which the key's details
show. The signed-in key rotating itself: the console goes on with the new pair and
says so, while the old one is refused.
"""

from collections.abc import Callable

from playwright.sync_api import Page, expect

from tests.console_page import (
    Console,
    Running,
    act_on_key,
    create_key_in_page,
    creds,
    key_row,
)


def rotate_in_page(page: Page, name: str, grace_seconds: int) -> tuple[str, str]:
    """Rotate the key through its Rotate action; the key ID and secret the page shows once."""
    act_on_key(page, name, "Rotate")
    dialog = page.locator("dialog")
    dialog.get_by_label("Grace period (seconds)").fill(str(grace_seconds))
    dialog.get_by_role("button", name="Rotate key").click()
    shown = page.locator("dialog.secret")
    expect(shown).to_contain_text("Key rotated")
    expect(shown).to_contain_text("shown this once")
    return page.locator("#new-key-id").inner_text(), page.locator("#new-key-secret").inner_text()


def new_key(console: Console, name: str, roles: list[str]) -> tuple[str, dict[str, str]]:
    """A key made through the API: its UUID and its pair."""
    status, body = console.api("/keys", method="POST", body={"name": name, "roles": roles})
    assert status == 200, body
    return body["result"]["key"]["id"], creds(body["result"]["keyId"], body["result"]["keySecret"])


def test_key_rotated_in_the_page_with_a_grace_period(open_console: Callable[..., Console]) -> None:
    console = open_console()
    page = console.page
    key, old = new_key(console, "to rotate", ["developer"])

    key_id, secret = rotate_in_page(page, "to rotate", 3600)
    assert secret.startswith("keysvc_") and len(key_id) == 20
    assert key_id != old["keyId"]
    expect(page.locator("dialog.secret")).to_contain_text("previous key ID and secret work until")
    # Both pairs work during the grace; the API says until when.
    for pair in (creds(key_id, secret), old):
        status, body = console.api("/v1/whoami", pair)
        assert status == 200, body
        assert body["result"]["id"] == key
    status, body = console.api(f"/keys/{key}")
    assert status == 200, body
    assert body["result"]["keySuffix"] == key_id[-4:]
    assert "previousCredentialExpiresAt" in body["result"]

    # Closed, the dialog takes the new secret out of the page.
    page.get_by_role("button", name="I have stored the secret").click()
    expect(page.locator("dialog")).to_have_count(0)
    assert secret not in page.content()
    # The key's details show the end of the grace and the new suffix.
    key_row(page, "to rotate").click()
    details = page.locator("dialog")
    expect(details).to_contain_text("Previous key ID and secret work until")
    expect(details).to_contain_text(key_id[-4:])


def test_signed_in_key_rotating_itself_goes_on_with_its_new_pair(
    open_console: Callable[..., Console], other_server: Running
) -> None:
    console = open_console(on=other_server)
    page, admin = console.page, console.admin
    key_row(page, "default admin").click()
    page.locator("dialog").get_by_role("button", name="Rotate", exact=True).click()
    # By its name: the details' dialog may still be closing.
    rotate = page.get_by_role("dialog", name="Rotate key default admin")
    expect(rotate).to_contain_text("the console switches to its new key ID")
    rotate.get_by_role("button", name="Close dialog").click()

    key_id, secret = rotate_in_page(page, "default admin", 0)
    expect(page.locator("dialog.secret")).to_contain_text("the console now uses the new key ID")
    page.get_by_role("button", name="I have stored the secret").click()
    messages = page.locator("#messages")
    expect(messages).to_contain_text("You rotated the key you are signed in with")
    # The old pair is refused at once; the new one is the admin key.
    status, body = console.api("/v1/whoami", creds(admin.key_id, admin.secret))
    assert status == 401 and body["error"].startswith("invalid credentials"), body
    status, body = console.api("/v1/whoami", creds(key_id, secret))
    assert status == 200, body
    assert body["result"]["id"] == admin.id

    # The console goes on with the new pair: it reads roles and makes a key.
    page.get_by_role("button", name="Roles", exact=True).click()
    expect(page.locator("[data-role='admin']")).to_be_visible()
    page.get_by_role("button", name="Keys", exact=True).click()
    made_id, made_secret = create_key_in_page(page, "made after the rotation")
    status, body = console.api("/v1/whoami", creds(made_id, made_secret))
    assert status == 200, body
    page.get_by_role("button", name="I have stored the secret").click()
    expect(page.locator("#messages .error")).to_have_count(0)
    # The new pair stays in memory only.
    kept = page.evaluate(
        "() => JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage),"
        " document.cookie, document.documentElement.outerHTML])"
    )
    assert secret not in kept and key_id not in kept
