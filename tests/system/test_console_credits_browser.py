"""Issue 29 in the console, in a real headless Chromium: a key's externalId, meta and
credits shown in its details and edited in its form, and the list filtered by
externalId on every page (tests/system/conftest.py's fixtures, as in
test_console_browser.py)."""

from collections.abc import Callable

from playwright.sync_api import expect

from tests.console_page import Console, act_on_key, key_row


def test_external_id_meta_and_credits_shown_edited_and_filtered(
    open_console: Callable[..., Console],
) -> None:
    console = open_console()
    page = console.page
    body = {
        "name": "tenant key",
        "roles": ["developer"],
        "externalId": "cust_42",
        "meta": {"plan": "pro"},
        "credits": {
            "remaining": 7,
            "refill": {"interval": "monthly", "amount": 50, "refillDay": 31},
        },
    }
    status, made = console.api("/keys", method="POST", body=body)
    assert status == 200, made
    key = f"/keys/{made['result']['key']['id']}"
    status, other = console.api(
        "/keys", method="POST", body={"name": "other", "roles": ["developer"]}
    )
    assert status == 200, other
    page.get_by_role("button", name="Keys", exact=True).click()
    key_row(page, "tenant key").click()
    details = page.locator("dialog dl.details")
    expect(details).to_contain_text("cust_42")
    expect(details).to_contain_text('{"plan":"pro"}')
    expect(details).to_contain_text("7 remaining; refilled to 50 monthly on day 31")
    page.keyboard.press("Escape")

    act_on_key(page, "tenant key", "Edit")
    dialog = page.locator("dialog")
    dialog.get_by_label("External ID").fill("cust_43")
    dialog.get_by_label("Meta").fill('{"plan": "team", "seats": 3}')
    dialog.get_by_label("Credits", exact=True).fill("100")
    dialog.get_by_label("Refill", exact=True).select_option("daily")
    dialog.get_by_label("Refill amount").fill("10")
    dialog.get_by_role("button", name="Save").click()
    # The row was there before the save: wait for the save's own message.
    expect(page.locator("#messages")).to_contain_text("saved")
    expect(key_row(page, "tenant key")).to_be_visible()
    status, read = console.api(key)
    assert status == 200, read
    result = read["result"]
    assert result["externalId"] == "cust_43"
    assert result["meta"] == {"plan": "team", "seats": 3}
    assert result["credits"]["remaining"] == 100
    assert result["credits"]["refill"] == {"interval": "daily", "amount": 10, "refillDay": 1}

    # Meta that is not a JSON object: the form says so and sends nothing.
    act_on_key(page, "tenant key", "Edit")
    dialog = page.locator("dialog")
    dialog.get_by_label("Meta").fill("[1, 2]")
    dialog.get_by_role("button", name="Save").click()
    expect(dialog.locator(".error")).to_contain_text("Meta: must be a JSON object")
    page.keyboard.press("Escape")

    # The filter asks the API: only the keys of that externalId, whatever the page.
    rows = page.locator("tbody tr")
    external = page.locator("[data-filter=externalId]")
    external.fill("cust_43")
    external.press("Enter")
    expect(rows).to_have_count(1)
    expect(key_row(page, "tenant key")).to_be_visible()
    expect(page.get_by_text("1 in the organization")).to_be_visible()
    external.fill("")
    external.press("Enter")
    expect(rows).to_have_count(3)  # the admin key too
