"""The console at /console, end to end in a real headless Chromium driven by Playwright.

Chromium is Debian's (tests/components.py), launched through its executable path:
Playwright never downloads a browser here. Each test opens the page on a real server,
signs in with the admin key ``bootstrap`` printed, works the page as a person would
(clicks, the keyboard), and checks what the API then says with the credentials the
page showed. A page that logs an error or a warning (a script error, a refusal by
the Content-Security-Policy) fails its test. Screenshots at 1280 and 390 px go to
test-artifacts/console/ (gitignored), named in the test output; docs/console-keys.png
is the 1280 px one. The fixtures are tests/system/conftest.py's, the helpers
tests/console_page.py's; the views of rotation, activities and usage are tested in
test_console_views_browser.py.
"""

import re
from collections.abc import Callable

import pytest
from playwright.sync_api import ViewportSize, expect

from tests.console_page import (
    NARROW,
    WIDE,
    Console,
    Running,
    act_on_key,
    create_key_in_page,
    create_role_in_page,
    creds,
    key_row,
    role_row,
    screenshot,
)
from tests.server import admin_creds, call

# Keys of every kind for the screenshots: roles, an expiry, an IP list, one disabled.
SCREENSHOT_KEYS = (
    {"name": "ci deploy", "roles": ["developer"], "ipAccessList": [{"source": "10.0.0.0/8"}]},
    {"name": "billing reports", "roles": ["query_endpoints"], "expireAt": "2031-06-30T00:00:00Z"},
    {"name": "old integration", "roles": ["developer"], "state": "disabled"},
)


def test_keys_flow_create_use_disable_edit_delete_sign_out(
    open_console: Callable[..., Console],
) -> None:
    console = open_console()
    page, admin = console.page, console.admin
    expect(page.locator("#sign-in")).to_be_hidden()

    key_id, secret = create_key_in_page(page, "browser made")
    assert secret.startswith("keysvc_") and len(key_id) == 20
    status, body = console.api("/v1/whoami", creds(key_id, secret))
    assert status == 200, body
    assert body["result"]["name"] == "browser made"
    new_key = f"/keys/{body['result']['id']}"
    page.get_by_role("button", name="I have stored the secret").click()
    # Closed, the dialog and the secret it showed are out of the page.
    expect(page.locator("dialog")).to_have_count(0)
    assert secret not in page.content()

    # Disabled in the page, refused by the API.
    act_on_key(page, "browser made", "Disable")
    messages = page.locator("#messages")
    expect(messages).to_contain_text("is disabled")
    status, body = console.api("/v1/whoami", creds(key_id, secret))
    assert (status, body["error"]) == (401, "key is disabled")

    # A custom role made in the Roles view, then given to the key by editing it.
    create_role_in_page(page, "auditors", "keys:read", "reports:read")
    act_on_key(page, "browser made", "Edit")
    dialog = page.locator("dialog")
    dialog.get_by_label("auditors").check()
    dialog.get_by_label("developer").uncheck()
    dialog.get_by_role("button", name="Save").click()
    expect(messages).to_contain_text("saved")
    status, body = console.api(new_key)
    assert status == 200, body
    assert [r["roleName"] for r in body["result"]["assignedRoles"]] == ["auditors"]
    # The filter by role finds it, and only it.
    page.get_by_label("Role", exact=True).select_option("auditors")
    expect(page.locator("tbody tr")).to_have_count(1)
    page.get_by_label("Role", exact=True).select_option("")

    # The role a key holds cannot go: the page shows the API's 409 and what to do.
    page.get_by_role("button", name="Roles", exact=True).click()
    role_row(page, "auditors").get_by_role("button", name="Delete").click()
    page.locator("dialog").get_by_role("button", name="Delete role").click()
    expect(messages).to_contain_text("HTTP 409")
    expect(messages).to_contain_text("Take it off those keys first")
    expect(messages.locator(".request-id")).to_contain_text("requestId ")

    # Deleted in the page, after a confirmation; gone for the API.
    act_on_key(page, "browser made", "Delete")
    page.locator("dialog").get_by_role("button", name="Delete key").click()
    expect(messages).to_contain_text("deleted")
    expect(key_row(page, "browser made")).to_have_count(0)
    status, body = console.api(new_key)
    assert status == 404, body

    # Signed out: no secret anywhere the page or its storage could keep it.
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    kept = page.evaluate(
        """() => ({
            html: document.documentElement.outerHTML,
            inputs: [...document.querySelectorAll('input, textarea')].map((i) => i.value),
            local: JSON.stringify(Object.entries(localStorage)),
            session: JSON.stringify(Object.entries(sessionStorage)),
            cookie: document.cookie,
        })"""
    )
    for value in (admin.secret, secret, admin.key_id, key_id):
        assert value not in kept["html"]
        assert value not in kept["inputs"]
    assert kept["local"] == kept["session"] == "[]"
    assert kept["cookie"] == ""
    assert console.context.cookies() == []


def test_name_ip_list_and_expiry_edited_in_the_page(
    open_console: Callable[..., Console],
) -> None:
    console = open_console()
    page = console.page
    status, body = console.api(
        "/keys", method="POST", body={"name": "to edit", "roles": ["developer"]}
    )
    assert status == 200, body
    key = f"/keys/{body['result']['key']['id']}"
    page.get_by_role("button", name="Keys", exact=True).click()
    act_on_key(page, "to edit", "Edit")
    dialog = page.locator("dialog")
    dialog.get_by_label("Name").fill("edited")
    dialog.get_by_label("IP access list").fill("192.0.2.0/24 office VPN\n2001:db8::/32")
    dialog.get_by_label("Expires").fill("2031-02-03T04:05")
    dialog.get_by_role("button", name="Save").click()
    expect(key_row(page, "edited")).to_be_visible()
    status, body = console.api(key)
    assert status == 200, body
    assert body["result"]["name"] == "edited"
    assert body["result"]["expireAt"] == "2031-02-03T04:05:00Z"
    assert body["result"]["ipAccessList"] == [
        {"source": "192.0.2.0/24", "description": "office VPN"},
        {"source": "2001:db8::/32"},
    ]
    # A bad entry: the dialog stays open with the API's field error and requestId.
    act_on_key(page, "edited", "Edit")
    dialog = page.locator("dialog")
    dialog.get_by_label("IP access list").fill("10.0.0.1/8")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.locator(".error")).to_contain_text("has host bits set; did you mean 10.0.0.0/8?")
    expect(dialog.locator(".request-id")).to_contain_text("requestId ")


def test_pages_of_keys_and_the_name_filter(
    open_console: Callable[..., Console], other_server: Running
) -> None:
    running, created = other_server
    admin = admin_creds(created)
    names = [f"service {n:02}" for n in range(30)]
    for name in names:
        status, body = call(running.base, f"/v1/organizations/{created['organizationId']}/keys",
                            creds(admin.key_id, admin.secret), "POST",
                            {"name": name, "roles": ["developer"]})  # fmt: skip
        assert status == 200, body
    page = open_console(on=other_server).page
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(25)  # the admin key and 24 of them, oldest first
    expect(page.get_by_text("31 in the organization")).to_be_visible()
    first = set(page.locator("[data-key]").all_inner_texts())
    page.get_by_role("button", name="Next page").click()
    expect(rows).to_have_count(6)
    second = set(page.locator("[data-key]").all_inner_texts())
    assert first.isdisjoint(second) and set(names) <= first | second
    expect(page.get_by_role("button", name="Next page")).to_be_disabled()
    page.get_by_label("Name").fill("service 29")
    expect(rows).to_have_count(1)
    # The filter stays as the pages change: service 29 is not on the first.
    page.get_by_role("button", name="Previous page").click()
    expect(page.get_by_text("0 of 25 keys on this page")).to_be_visible()
    page.get_by_label("Name").fill("")
    expect(rows).to_have_count(25)


def test_custom_role_created_edited_and_deleted(open_console: Callable[..., Console]) -> None:
    console = open_console()
    page = console.page
    create_role_in_page(page, "release managers", "keys:update")

    role_row(page, "release managers").get_by_role("button", name="Edit").click()
    dialog = page.locator("dialog")
    dialog.get_by_label("Name").fill("releasers")
    dialog.get_by_label("Other permissions").fill("deploys:*")
    dialog.get_by_role("button", name="Save").click()
    expect(role_row(page, "releasers")).to_contain_text("deploys:*")
    status, body = console.api("/roles")
    assert status == 200, body
    (role,) = [r for r in body["result"] if r["name"] == "releasers"]
    assert sorted(role["permissions"]) == ["deploys:*", "keys:update"]

    role_row(page, "releasers").get_by_role("button", name="Delete").click()
    page.locator("dialog").get_by_role("button", name="Delete role").click()
    expect(page.locator("#messages")).to_contain_text("Role releasers deleted")
    expect(role_row(page, "releasers")).to_have_count(0)
    status, body = console.api(f"/roles/{role['id']}")
    assert status == 404, body


def test_calling_key_cannot_delete_itself_and_the_page_says_why(
    open_console: Callable[..., Console],
) -> None:
    console = open_console()
    page = console.page
    page.locator(f"[data-key='{console.admin.id}']").click()
    dialog = page.locator("dialog")
    expect(dialog.get_by_role("button", name="Delete")).to_be_disabled()
    expect(dialog).to_contain_text("a key cannot delete itself")
    # Escape closes the dialog, and it leaves the page.
    page.keyboard.press("Escape")
    expect(page.locator("dialog")).to_have_count(0)
    # A reload forgets the key, as closing the tab does: nothing kept it.
    page.reload()
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    expect(page.locator("#view")).to_be_hidden()


def test_hash_data_key_made_in_the_browser_works_against_the_api(
    open_console: Callable[..., Console],
) -> None:
    console = open_console()
    console.context.grant_permissions(["clipboard-read", "clipboard-write"])
    key_id, secret = create_key_in_page(console.page, "hashed in browser", hash_data=True)
    # The copy button puts the secret on the clipboard.
    console.page.get_by_role("button", name="Copy secret").click()
    expect(console.page.get_by_role("button", name="Copied")).to_be_visible()
    assert console.page.evaluate("() => navigator.clipboard.readText()") == secret
    status, body = console.api("/v1/whoami", creds(key_id, secret))
    assert status == 200, body
    assert body["result"]["name"] == "hashed in browser"


def test_wrong_secret_shows_the_api_error_not_a_blank_page(
    open_console: Callable[..., Console],
) -> None:
    console = open_console(signed_in=False)
    right = console.admin.secret
    console.sign_in(right[:-1] + ("x" if right[-1] != "x" else "y"))
    messages = console.page.locator("#messages")
    expect(messages).to_contain_text("HTTP 401")
    expect(messages).to_contain_text("invalid credentials")
    expect(messages.locator(".request-id")).to_have_text(re.compile(r"requestId [0-9a-f-]{36}"))
    expect(console.page.get_by_role("button", name="Sign in")).to_be_visible()
    assert console.page.get_by_label("Secret").input_value() == ""


def test_sign_in_and_dialogs_by_keyboard_alone(open_console: Callable[..., Console]) -> None:
    console = open_console(signed_in=False)
    page = console.page
    # The key ID field has the focus on arrival; Tab to the secret, Enter signs in.
    expect(page.get_by_label("Key ID")).to_be_focused()
    page.keyboard.type(console.admin.key_id)
    page.keyboard.press("Tab")
    page.keyboard.type(console.admin.secret)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Keys", exact=True)).to_be_visible()
    # The focus is on the first view's button; Tab past Roles, Identities and Activities
    # to New key, Enter opens its dialog, whose first field takes the focus.
    expect(page.get_by_role("button", name="Keys", exact=True)).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Identities", exact=True)).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Activities", exact=True)).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="New key")).to_be_focused()
    page.keyboard.press("Enter")
    dialog = page.locator("dialog")
    expect(dialog.get_by_label("Name")).to_be_focused()
    # The focus stays in the dialog: back past its first control to its last, and on.
    page.keyboard.press("Shift+Tab")
    expect(dialog.get_by_role("button", name="Close dialog")).to_be_focused()
    page.keyboard.press("Shift+Tab")
    expect(dialog.get_by_role("button", name="Create key")).to_be_focused()
    page.keyboard.press("Tab")
    expect(dialog.get_by_role("button", name="Close dialog")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("dialog")).to_have_count(0)


@pytest.fixture(scope="module")
def seeded(server: Running) -> None:
    running, created = server
    admin = admin_creds(created)
    for body in SCREENSHOT_KEYS:
        status, answer = call(running.base, f"/v1/organizations/{created['organizationId']}/keys",
                              creds(admin.key_id, admin.secret), "POST", body)  # fmt: skip
        assert status == 200, answer


@pytest.mark.usefixtures("seeded")
@pytest.mark.parametrize(("viewport", "name"), [(WIDE, "1280"), (NARROW, "390")])
def test_screenshots_at_both_widths(
    open_console: Callable[..., Console],
    capsys: pytest.CaptureFixture[str],
    viewport: ViewportSize,
    name: str,
) -> None:
    page = open_console(viewport).page
    expect(key_row(page, "old integration")).to_be_visible()
    # Nothing wider than the window: the narrow layout stacks the table.
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    screenshot(page, f"console-keys-{name}.png", capsys)
    key_row(page, "ci deploy").click()
    expect(page.locator("dialog")).to_contain_text("10.0.0.0/8")
    screenshot(page, f"console-key-details-{name}.png", capsys)
