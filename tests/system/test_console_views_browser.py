"""The console's views of rotation, the activity log and usage, end to end in a real
headless Chromium driven by Playwright (as tests/system/test_console_browser.py).

A key rotated in the page with a grace period: the new pair the page shows once works
against the API, and so does the old one during the grace, which the key's details
show. The signed-in key rotating itself: the console goes on with the new pair and
says so, while the old one is refused. The activities table lists the create and the
rotation made in the test, by type and target, with their before and after values;
a key without activities:read sees the API's 403 and requestId in the view. A key's
usage chart shows the counts the API answers for the requests the test made.
Screenshots of the new views at 1280 and 390 px go to test-artifacts/console/.
"""

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from playwright.sync_api import Locator, Page, ViewportSize, expect

from tests.console_page import (
    NARROW,
    WIDE,
    Console,
    Running,
    act_on_key,
    create_key_in_page,
    creds,
    key_row,
    screenshot,
)
from tests.helpers import ROTATED

OUTCOMES = (
    "success", "disabled", "expired", "ipDenied", "forbidden", "rateLimited", "creditsExhausted"
)  # fmt: skip
# The usage counts reach the database each second (conftest's SERVE_ARGS); this is
# how long a test waits for them on a loaded machine.
COUNTS_DEADLINE = 90.0


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
    # The old pair is refused at once, as rotated; the new one is the admin key.
    status, body = console.api("/v1/whoami", creds(admin.key_id, admin.secret))
    assert status == 401 and body["error"] == ROTATED, body
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


@pytest.mark.parametrize(("viewport", "width"), [(WIDE, "1280"), (NARROW, "390")])
def test_activities_list_the_create_and_the_rotation_made_in_the_page(
    open_console: Callable[..., Console],
    other_server: Running,
    capsys: pytest.CaptureFixture[str],
    viewport: ViewportSize,
    width: str,
) -> None:
    console = open_console(viewport, on=other_server)
    page = console.page
    key_id, _ = create_key_in_page(page, "audited")
    page.get_by_role("button", name="I have stored the secret").click()
    new_id, _ = rotate_in_page(page, "audited", 60)
    page.get_by_role("button", name="I have stored the secret").click()
    status, body = console.api("/keys")
    assert status == 200, body
    (key,) = [k["id"] for k in body["result"] if k["name"] == "audited"]

    # By keyboard: the Activities button of the navigation, then Enter.
    page.get_by_role("button", name="Activities", exact=True).focus()
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Activities", exact=True)).to_be_visible()
    rows = page.locator("tbody tr", has=page.locator(f"[data-target='{key}']"))
    expect(rows).to_have_count(2)
    expect(rows.nth(0)).to_contain_text("key_create: created")
    expect(rows.nth(0)).to_contain_text('key "audited"')
    expect(rows.nth(1)).to_contain_text("openapi_key_update: key-rotated")
    expect(rows.nth(1)).to_contain_text("(you)")
    # The same two, in the API's order, as the API lists them.
    status, body = console.api("/activities?include=keysvc")
    assert status == 200, body
    listed = [
        (a["type"], a.get("keyUpdateType")) for a in body["result"] if a.get("targetKeyId") == key
    ]
    assert listed == [("key_create", "created"), ("openapi_key_update", "key-rotated")]
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    screenshot(page, f"console-activities-{width}.png", capsys)

    # The rotation's before and after: the key ID suffix it answered to, and the new one.
    rows.nth(1).get_by_role("button", name="Before and after").click()
    changes = page.locator("dialog")
    suffix = changes.locator("tr", has_text="keySuffix")
    expect(suffix).to_contain_text(f'"{key_id[-4:]}"')
    expect(suffix).to_contain_text(f'"{new_id[-4:]}"')
    expect(changes.locator("tr", has_text="previousCredentialExpiresAt")).to_be_visible()
    screenshot(page, f"console-activity-{width}.png", capsys)
    page.keyboard.press("Escape")
    expect(page.locator("dialog")).to_have_count(0)

    # Dates after everything: none between them.
    page.get_by_label("From").fill("2099-01-01T00:00")
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_text("0 activities between these dates")).to_be_visible()
    expect(page.locator("tbody tr")).to_have_count(0)


def test_activities_without_the_permission_show_the_apis_403(
    open_console: Callable[..., Console],
) -> None:
    console = open_console(signed_in=False)
    _, pair = new_key(console, "reads keys only", ["developer"])
    status, refused = console.api("/activities", pair)
    assert status == 403, refused
    console.sign_in(pair["keySecret"], pair["keyId"])
    page = console.page
    expect(page.get_by_role("heading", name="Keys", exact=True)).to_be_visible()
    page.get_by_role("button", name="Activities", exact=True).click()
    view = page.locator("#view")
    expect(view.locator(".error")).to_contain_text("HTTP 403")
    expect(view.locator(".error-message")).to_have_text(refused["error"])
    expect(view.locator(".request-id")).to_contain_text("requestId ")
    expect(view).to_contain_text("needs the activities:read permission")


def usage_totals(console: Console, key: str, granularity: str) -> dict[str, int]:
    """The key's counts by outcome over the last hour, summed, at ``granularity``."""
    start = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    query = f"granularity={granularity}&from={start}"
    status, body = console.api(f"/keys/{key}/usage?{query}")
    assert status == 200, body
    return {o: sum(bucket[o] for bucket in body["result"]["series"]) for o in OUTCOMES}


def wait_for_counts(console: Console, key: str, wanted: dict[str, int]) -> None:
    deadline = time.monotonic() + COUNTS_DEADLINE
    while (got := usage_totals(console, key, "minute")) != wanted:
        assert time.monotonic() < deadline, (got, wanted)
        time.sleep(0.25)


def expect_counts(usage: Locator, granularity: str, counts: dict[str, int]) -> None:
    """Choose ``granularity``; the summary and the table's totals show ``counts``."""
    usage.get_by_label("Granularity").select_option(granularity)
    summary = usage.locator(".usage-summary")
    expect(summary).to_contain_text(f"by {granularity}")
    expect(summary).to_contain_text(f"Admitted {counts['success']},")
    expect(summary).to_contain_text(f"Forbidden {counts['forbidden']},")
    totals = usage.locator("tfoot")
    for outcome, count in counts.items():
        expect(totals.locator(f"[data-outcome='{outcome}']")).to_have_text(str(count))
    expect(totals.locator("[data-outcome='total']")).to_have_text(str(sum(counts.values())))


@pytest.mark.parametrize(("viewport", "width"), [(WIDE, "1280"), (NARROW, "390")])
def test_usage_chart_shows_the_counts_the_api_answers(
    open_console: Callable[..., Console],
    capsys: pytest.CaptureFixture[str],
    viewport: ViewportSize,
    width: str,
) -> None:
    console = open_console(viewport)
    page = console.page
    name = f"used {width}"
    key, pair = new_key(console, name, ["developer"])
    # Admitted: reading keys; forbidden: the activity log, which developer may not read.
    for _ in range(3):
        assert console.api("/keys", pair)[0] == 200
    for _ in range(2):
        assert console.api("/activities", pair)[0] == 403
    wanted = {o: 0 for o in OUTCOMES} | {"success": 3, "forbidden": 2}
    wait_for_counts(console, key, wanted)

    page.get_by_role("button", name="Keys", exact=True).click()
    key_row(page, name).click()
    usage = page.locator("dialog section.usage")
    for granularity in ("hour", "minute", "day"):
        answered = usage_totals(console, key, granularity)
        assert answered == wanted, granularity
        expect_counts(usage, granularity, answered)
    # The chart: an image named by the summary, bars for the two outcomes, a legend.
    chart = usage.locator("svg[role='img']")
    expect(chart).to_be_visible()
    expect(chart.locator("rect.outcome-success")).not_to_have_count(0)
    expect(chart.locator("rect.outcome-forbidden")).not_to_have_count(0)
    expect(usage.locator(".legend")).to_contain_text("Rate limited")
    # The table, opened by keyboard, lists the bucket that holds the requests.
    usage.get_by_text("The counts as a table").focus()
    page.keyboard.press("Enter")
    table = usage.locator(".usage-table table")
    expect(table).to_be_visible()
    expect(table.locator("tbody tr")).not_to_have_count(0)
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0
    screenshot(page, f"console-usage-{width}.png", capsys)


def test_usage_chart_holds_this_minute_on_a_browser_clock_behind_the_servers(
    open_console: Callable[..., Console],
) -> None:
    """The browser's clock at the very start of the minute of the requests: the chart
    still holds that minute's bucket, as the server's clock places them."""
    console = open_console()
    page = console.page
    key, pair = new_key(console, "used this minute", ["developer"])
    for _ in range(2):
        assert console.api("/keys", pair)[0] == 200
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    wanted = {o: 0 for o in OUTCOMES} | {"success": 2}
    wait_for_counts(console, key, wanted)
    page.clock.set_fixed_time(minute)
    page.get_by_role("button", name="Keys", exact=True).click()
    key_row(page, "used this minute").click()
    expect_counts(page.locator("dialog section.usage"), "minute", wanted)
