"""Who may read /metrics, and what it may tell them: with KEYSVC_METRICS_TOKEN
set, only a caller sending it as a bearer token; and never whether a key ID
exists (an unknown key ID and a wrong secret are one reason, in the metrics and
in the access log alike)."""

import logging

import pytest

from keysvc.config import ConfigError, Settings, build_settings
from keysvc.credentials import new_key_id, new_secret
from keysvc.errors import BearerUnauthorized
from keysvc.metrics import AUTH_REASONS
from tests.api.metrics import TOKEN, Samples, scrape, status_of, value
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    basic,
    bootstrap,
    client_with,
)

REFUSED = BearerUnauthorized.default_message


def outcomes(samples: Samples) -> dict[str, float]:
    return {
        reason: value(samples, "keysvc_auth_outcomes_total", reason=reason)
        for reason in AUTH_REASONS
    }


def counts_moved(
    before: Samples, after: Samples
) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """How every count of the scrape moved (counters and histograms' counts; not the
    sums, buckets and gauges, which time and the machine move)."""
    return {
        sample: count - before.get(sample, 0.0)
        for sample, count in after.items()
        if sample[0].endswith(("_total", "_count")) and count != before.get(sample, 0.0)
    }


async def test_unknown_key_and_wrong_secret_are_one_reason(
    client: Client, admin: Creds, caplog: pytest.LogCaptureFixture
) -> None:
    """What a scrape shows after an unknown key ID is what it shows after a wrong
    secret, for a key cached and not: one reason, counted the same."""
    caplog.set_level(logging.INFO, logger="keysvc.access")
    path = f"/v1/organizations/{admin.organization_id}/keys"
    attempts = {
        "unknown key ID": basic(new_key_id(), new_secret()),
        "wrong secret, key not cached": basic(admin.key_id, new_secret()),
        "wrong secret, key cached": basic(admin.key_id, new_secret()),
    }
    _, before = await scrape(client)
    changes = {}
    counted = {}
    for name, headers in attempts.items():
        assert await status_of(client, "GET", path, headers) == 401
        text, after = await scrape(client)
        changes[name] = {
            reason: count - outcomes(before)[reason]
            for reason, count in outcomes(after).items()
            if count != outcomes(before)[reason]
        }
        counted[name] = counts_moved(before, after)
        before = after
        if name.endswith("not cached"):
            assert await status_of(client, "GET", path, admin.headers) == 200
            _, before = await scrape(client)
    assert list(changes.values()) == [{"invalid_credentials": 1}] * 3
    # Nor does any other count in the scrape move differently: store reads included.
    first, *others = counted.values()
    assert all(other == first for other in others), counted
    assert 'reason="unknown"' not in text and 'reason="bad_secret"' not in text

    refused = [r for r in caplog.records if r.name == "keysvc.access" and r.status == 401]
    assert [r.auth for r in refused] == ["invalid_credentials"] * 3


def test_metrics_token_setting() -> None:
    assert build_settings(env={}).metrics_token is None
    assert build_settings(env={"KEYSVC_METRICS_TOKEN": TOKEN}).metrics_token == TOKEN
    flags = {"metrics_token": TOKEN + "x"}
    assert build_settings(flags, env={"KEYSVC_METRICS_TOKEN": TOKEN}).metrics_token == TOKEN + "x"
    # Never shown with the rest of the settings.
    assert TOKEN not in repr(build_settings(env={"KEYSVC_METRICS_TOKEN": TOKEN}))


@pytest.mark.parametrize("bad", ["short", "has a space in it here", "sixteen-but-é-no-ascii"])
def test_a_weak_or_odd_metrics_token_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env={"KEYSVC_METRICS_TOKEN": bad})
    assert str(caught.value) == (
        "metrics-token: must be at least 16 printable ASCII characters, without spaces"
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ],
    ids=["none", "no token", "empty", "short by one", "one more", "Basic", "no scheme"],
)
async def test_metrics_without_the_token_is_401(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, headers: dict[str, str]
) -> None:
    client = await client_with(aiohttp_client, settings, clock, metrics_token=TOKEN)
    response = await client.get("/metrics", headers=headers)
    await assert_error(response, 401, REFUSED)
    assert response.headers["WWW-Authenticate"].startswith("Bearer ")
    assert TOKEN not in await response.text()


async def test_metrics_with_the_token(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, metrics_token=TOKEN)
    admin = await bootstrap(client.app)
    # A key, even the admin's, is not the metrics token.
    await assert_error(await client.get("/metrics", headers=admin.headers), 401, REFUSED)
    twice = [("Authorization", f"Bearer {TOKEN}")] * 2
    await assert_error(await client.get("/metrics", headers=twice), 401, REFUSED)
    for scheme in ("Bearer", "bearer"):
        response = await client.get("/metrics", headers={"Authorization": f"{scheme} {TOKEN}"})
        text = await response.text()
        assert response.status == 200, text
        assert "keysvc_auth_outcomes_total" in text
    # The refused scrapes are counted like any other request.
    _, samples = await scrape(client, {"Authorization": f"Bearer {TOKEN}"})
    refusals = {"route": "/metrics", "method": "GET", "status": "401"}
    assert value(samples, "keysvc_http_requests_total", **refusals) == 2
