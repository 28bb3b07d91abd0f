"""Prometheus metrics at /metrics: request counts and latency by route template,
authentication outcomes by reason, keys by state, database time; no secret or
key ID in the output; a registry per app; and KEYSVC_METRICS=off."""

import re
import time
from datetime import timedelta
from pathlib import Path

import prometheus_client
import pytest

from keysvc.config import ConfigError, Settings, build_settings
from keysvc.credentials import new_key_id, new_secret
from keysvc.http.app import create_app
from keysvc.http.state import METRICS, STORE
from keysvc.metrics import (
    AUTH,
    AUTH_REASONS,
    KEYS_COUNTED_EVERY_SECONDS,
    LATENCY,
    LATENCY_BUCKETS,
    REQUESTS,
    RequestTallies,
)
from tests.api.metrics import scrape, status_of, value
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    basic,
    bootstrap,
    client_with,
    create_creds,
    settled,
)

KEYS = "/v1/organizations/{organizationId}/keys"
KEY = KEYS + "/{keyId}"


async def test_metrics_after_traffic(
    client: Client, admin: Creds, other_admin: Creds, clock: FakeClock
) -> None:
    # The bootstraps' announcements heard now: none drops a credential checked below.
    await settled(client.app)
    org = admin.organization_id
    keys_path = f"/v1/organizations/{org}/keys"
    soon = (clock.now + timedelta(hours=1)).isoformat()
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    off = await create_creds(
        client, admin, {"name": "off", "roles": ["developer"], "state": "disabled"}
    )
    old = await create_creds(
        client, admin, {"name": "old", "roles": ["developer"], "expireAt": soon}
    )
    clock.advance(hours=2)
    far = await create_creds(
        client,
        admin,
        {"name": "far", "roles": ["developer"], "ipAccessList": [{"source": "10.0.0.0/8"}]},
    )
    unknown = [basic(new_key_id(), new_secret()), basic("no-such-key", "whatever")]
    wrong = [basic(admin.key_id, s) for s in (new_secret(), "wrong", "also-wrong")]
    malformed = [
        {},
        {"Authorization": "Digest abc"},  # a scheme keysvc has no use for
        {"Authorization": "Basic !!!"},
        basic(admin.key_id, "keysvc_" + "A" * 42),  # a keysvc_ secret with a bad checksum
    ]
    one = f"{keys_path}/{dev.id}"
    calls = [
        ("GET", one, dev.headers, 200),  # ok
        ("POST", keys_path, dev.headers, 403),  # permission: developer cannot create
        ("GET", keys_path, other_admin.headers, 403),  # permission: another organization
        ("GET", one, off.headers, 401),  # disabled
        ("GET", one, old.headers, 401),  # expired
        ("GET", one, far.headers, 403),  # ip
        *[("GET", one, headers, 401) for headers in unknown + wrong + malformed],
        ("GET", "/healthz", {}, 200),
        ("GET", f"/no/such/{dev.id}", admin.headers, 404),
    ]
    for method, path, headers, status in calls:
        assert await status_of(client, method, path, headers) == status, (method, path)

    text, samples = await scrape(client)

    requests = "keysvc_http_requests_total"
    assert value(samples, requests, route=KEYS, method="POST", status="200") == 4
    assert value(samples, requests, route=KEYS, method="POST", status="403") == 1
    assert value(samples, requests, route=KEYS, method="GET", status="403") == 1
    assert value(samples, requests, route=KEY, method="GET", status="200") == 1
    assert value(samples, requests, route=KEY, method="GET", status="403") == 1
    assert value(samples, requests, route=KEY, method="GET", status="401") == 2 + 9
    assert value(samples, requests, route="/healthz", method="GET", status="200") == 1
    assert value(samples, requests, route="unmatched", method="GET", status="404") == 1
    # The scrape counts itself only once it has answered.
    assert value(samples, requests, route="/metrics", method="GET", status="200") == 0

    latency = "keysvc_http_request_duration_seconds"
    # The four creates and the developer's refused one.
    assert value(samples, latency + "_count", route=KEYS, method="POST") == 5
    assert value(samples, latency + "_bucket", route=KEYS, method="POST", le="+Inf") == 5
    assert value(samples, latency + "_sum", route=KEYS, method="POST") > 0
    assert value(samples, latency + "_count", route="unmatched", method="GET") == 1

    outcomes = {
        reason: value(samples, "keysvc_auth_outcomes_total", reason=reason)
        for reason in AUTH_REASONS
    }
    assert outcomes == {
        "ok": 4 + 1,  # the four creates and the developer's read
        "malformed": 4,
        "invalid_credentials": 2 + 3,  # unknown key IDs and wrong secrets alike
        "rotated": 0,
        "disabled": 1,
        "expired": 1,
        "ip": 1,
        "permission": 2,
        "rate_limited": 0,
    }
    # Exported at zero from the start, so the series exists before anything happens.
    assert ("keysvc_auth_outcomes_total", frozenset({("reason", "rate_limited")})) in samples

    # Two bootstrap admins, dev and far are usable; off is disabled; old has expired.
    assert {
        s: value(samples, "keysvc_keys", state=s) for s in ("enabled", "disabled", "expired")
    } == {
        "enabled": 4,
        "disabled": 1,
        "expired": 1,
    }

    db = "keysvc_db_call_duration_seconds"
    assert value(samples, db + "_count", operation="create_key") == 4
    assert value(samples, db + "_count", operation="bootstrap") == 2
    assert value(samples, db + "_count", operation="count_keys_by_state") == 1
    # Every credential check is one observation, whether the cache or the database
    # answered it: each key's first use (admin, other_admin, dev, off, old, far), each
    # unknown key ID and each wrong secret. A header already proven is not checked again.
    assert value(samples, db + "_count", operation="check_credentials") == 6 + 2 + 3
    assert value(samples, db + "_count", operation="find_credential") == 0
    assert value(samples, db + "_sum", operation="create_key") > 0

    # Neither credentials nor identifiers from paths make it into the output.
    secrets: set[str] = set()
    for creds in (admin, other_admin, dev, off, old, far):
        secrets |= {creds.key_id, creds.secret, creds.headers["Authorization"]}
    secrets |= {h["Authorization"] for h in unknown + wrong + malformed if h}
    secrets |= {org, dev.id, "/no/such"}
    for secret in secrets:
        assert secret not in text


async def test_gauge_follows_the_database(client: Client, admin: Creds, clock: FakeClock) -> None:
    _, before = await scrape(client)
    assert value(before, "keysvc_keys", state="enabled") == 1
    await create_creds(client, admin, {"name": "n", "roles": ["developer"], "state": "disabled"})
    clock.advance(seconds=KEYS_COUNTED_EVERY_SECONDS)  # counted at most that often
    _, after = await scrape(client)
    assert value(after, "keysvc_keys", state="enabled") == 1
    assert value(after, "keysvc_keys", state="disabled") == 1
    requests = "keysvc_http_requests_total"
    assert value(after, requests, route="/metrics", method="GET", status="200") == 1


async def test_each_app_has_its_own_registry(
    aiohttp_client: ClientFactory, client: Client, tmp_path: Path
) -> None:
    other = await aiohttp_client(create_app(Settings(db_path=tmp_path / "other.db")))
    for _ in range(3):
        await status_of(client, "GET", "/healthz", {})
    _, mine = await scrape(client)
    _, theirs = await scrape(other)
    healthz = {"route": "/healthz", "method": "GET", "status": "200"}
    assert value(mine, "keysvc_http_requests_total", **healthz) == 3
    assert value(theirs, "keysvc_http_requests_total", **healthz) == 0
    assert client.app[METRICS].registry is not other.app[METRICS].registry
    assert b"keysvc_" not in prometheus_client.generate_latest(prometheus_client.REGISTRY)


async def test_odd_methods_do_not_mint_label_values(client: Client) -> None:
    assert await status_of(client, "PROPFIND", "/coffee", {}) == 404
    text, samples = await scrape(client)
    assert "PROPFIND" not in text
    assert (
        value(
            samples, "keysvc_http_requests_total", route="unmatched", method="other", status="404"
        )
        == 1
    )


async def test_metrics_off_is_a_404_and_collects_nothing(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    app = create_app(Settings(db_path=tmp_path / "off.db", metrics=False))
    client: Client = await aiohttp_client(app)
    response = await client.get("/metrics")
    await assert_error(response, 404, "not found: no such endpoint")
    assert METRICS not in client.app
    assert client.app[STORE].observer is None
    assert await status_of(client, "GET", "/healthz", {}) == 200


@pytest.mark.parametrize(("raw", "on"), [("on", True), ("off", False), ("OFF", False)])
def test_metrics_setting(raw: str, on: bool) -> None:
    assert build_settings(env={}).metrics is True
    assert build_settings(env={"KEYSVC_METRICS": raw}).metrics is on
    assert build_settings({"metrics": raw}, env={"KEYSVC_METRICS": "bogus"}).metrics is on


def test_bad_metrics_setting_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        build_settings(env={"KEYSVC_METRICS": "maybe"})
    assert str(caught.value) == "metrics: 'maybe' must be on or off"


def _reference_exposition(observations: list[tuple[str, str, int, float]]) -> bytes:
    """What prometheus_client's own Counter and Histogram export for these requests."""
    registry = prometheus_client.CollectorRegistry()
    names = {family[0]: family for family in (REQUESTS, LATENCY, AUTH)}
    requests = prometheus_client.Counter(*names[REQUESTS[0]], registry=registry)
    latency = prometheus_client.Histogram(*names[LATENCY[0]], registry=registry)
    auth = prometheus_client.Counter(*names[AUTH[0]], registry=registry)
    outcomes = {reason: auth.labels(reason=reason) for reason in AUTH_REASONS}
    for route, method, status, seconds in observations:
        requests.labels(route=route, method=method, status=str(status)).inc()
        latency.labels(route=route, method=method).observe(seconds)
        outcomes["ok" if status == 200 else "invalid_credentials"].inc()
    return prometheus_client.generate_latest(registry)


def test_request_tallies_export_what_prometheus_client_would() -> None:
    """Counts, cumulative buckets (edges included), sums, label order and _created."""
    bounds = [b for b in LATENCY_BUCKETS if b != float("inf")]
    observations = [
        ("/v1/verify", "GET", 200, 0.0),
        ("/v1/verify", "GET", 401, bounds[0]),  # on an edge: counted in that bucket
        (KEY, "GET", 200, 0.0123),
        ("/v1/verify", "GET", 200, bounds[-1] + 1),  # only in +Inf
        (KEYS, "POST", 201, bounds[3]),
        (KEY, "GET", 200, 0.3),
        ("unmatched", "other", 404, 1e-9),
    ]
    started = time.time()
    tallies = RequestTallies()
    for route, method, status, seconds in observations:
        tallies.request(route, method, status, seconds)
        tallies.auth("ok" if status == 200 else "invalid_credentials")
    registry = prometheus_client.CollectorRegistry()
    registry.register(tallies)
    ours = prometheus_client.generate_latest(registry).decode()
    reference = _reference_exposition(observations).decode()
    created = re.compile(r"^(\w+_created(?:\{.*\})?) (\S+)$", re.MULTILINE)
    stamps = [float(stamp) for _, stamp in created.findall(ours)]
    assert len(stamps) == 5 + 4 + len(AUTH_REASONS)  # a _created for every child
    assert all(started <= stamp <= time.time() for stamp in stamps)
    assert created.sub(r"\1 T", ours) == created.sub(r"\1 T", reference)
    assert 'keysvc_http_request_duration_seconds_bucket{le="0.005",method="GET",' in ours


async def test_refusals_over_a_limit_count_as_rate_limited(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, auth_failures=2)
    await bootstrap(client.app)
    wrong = basic(new_key_id(), new_secret())
    statuses = [await status_of(client, "GET", "/v1/verify", wrong) for _ in range(5)]
    assert statuses == [401, 401, 429, 429, 429]
    _, samples = await scrape(client)
    assert value(samples, "keysvc_auth_outcomes_total", reason="invalid_credentials") == 2
    assert value(samples, "keysvc_auth_outcomes_total", reason="rate_limited") == 3
