"""The hostile review of issue 36's named rate limits (rt/36), through the real app on
both backends: what a client may name in X-Ratelimit, which a proxy that forwards the
client's headers (Traefik's ForwardAuth does by default) passes on. Before, naming an
autoApply limit at cost 0 in the header (``X-Ratelimit: burst;cost=0``) checked it
without counting, so such a client was never counted by a limit that applies to every
verify; the query, which the proxy alone writes, may still say 0. And one organization
that renamed its limits without end filled the process's bounded table of counts, whose
oldest (another organization's) were dropped: that organization's 1-a-day limit let a
second request through (6,300 renames, 230 s, with the shipped bound of 100,000; here
the app's table is made smaller, the same real counter)."""

from typing import Any

from aiohttp import web

from keysvc.domain.ratelimit import WindowCounter
from keysvc.http.state import LIMITS
from tests.helpers import Client, Creds, FakeClock, assert_ok, bootstrap, create_creds

VERIFY = "/v1/verify"
JSON = {"Accept": "application/json"}
BURST = {"name": "burst", "limit": 3, "windowSeconds": 10, "autoApply": True}


async def _statuses(client: Client, key: Creds, url: str, times: int, **headers: str) -> list[int]:
    return [
        (await client.get(url, headers={**key.headers, **headers})).status for _ in range(times)
    ]


def _at_window_start(clock: FakeClock) -> None:
    clock.now = clock.now.replace(second=0, microsecond=0)


async def _checked(client: Client, key: Creds, url: str = VERIFY, **headers: str) -> Any:
    response = await client.get(url, headers={**key.headers, **JSON, **headers})
    return [(s["name"], s["remaining"]) for s in (await assert_ok(response))["ratelimits"]]


async def test_a_header_cannot_lower_an_auto_apply_limits_count_to_nothing(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    body = {"name": "k", "roles": ["developer"], "ratelimits": [BURST], "externalId": "team"}
    key = await create_creds(client, admin, body)
    _at_window_start(clock)
    forged = {"X-Ratelimit": "burst;cost=0"}
    assert await _statuses(client, key, VERIFY, 4, **forged) == [200, 200, 200, 429]
    # An identity's autoApply limit alike.
    identities = f"/v1/organizations/{admin.organization_id}/identities"
    found = await assert_ok(await client.get(identities, headers=admin.headers))
    url = f"{identities}/{found[0]['id']}"
    shared = {"ratelimits": [{**BURST, "name": "shared"}]}
    await assert_ok(await client.patch(url, json=shared, headers=admin.headers))
    other = await create_creds(client, admin, {**body, "ratelimits": None})
    assert await _statuses(client, other, VERIFY, 4, **{"X-Ratelimit": "shared;cost=0"}) == [
        200, 200, 200, 429,
    ]  # fmt: skip


async def test_the_query_still_checks_an_auto_apply_limit_without_counting(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await create_creds(
        client, admin, {"name": "k", "roles": ["developer"], "ratelimits": [BURST]}
    )
    _at_window_start(clock)
    assert await _checked(client, key, VERIFY + "?ratelimit=burst:0") == [("burst", 3)]
    assert await _checked(client, key, **{"X-Ratelimit": "burst;cost=2"}) == [("burst", 1)]
    assert await _checked(client, key) == [("burst", 0)]


async def test_one_organizations_churn_of_limit_names_keeps_anothers_counts(
    client: Client, admin: Creds, app: web.Application
) -> None:
    app[LIMITS].requests = WindowCounter(max_entries=100)
    day = {"name": "day", "limit": 1, "windowSeconds": 86400, "autoApply": True}
    victim = await create_creds(
        client, admin, {"name": "v", "roles": ["developer"], "ratelimits": [day]}
    )
    plain = await create_creds(
        client,
        admin,
        {"name": "p", "roles": ["developer"], "rateLimit": {"limit": 1, "windowSeconds": 86400}},
    )
    for key in (victim, plain):
        assert await _statuses(client, key, VERIFY, 2) == [200, 429]
    other = await bootstrap(app, "other")
    churner = await create_creds(client, other, {"name": "c", "roles": ["developer"]})
    url = f"/v1/organizations/{other.organization_id}/keys/{churner.id}"
    for round_ in range(20):
        names = [{**day, "name": f"n{round_}-{n}", "limit": 1000} for n in range(16)]
        patched = await client.patch(url, json={"ratelimits": names}, headers=other.headers)
        await assert_ok(patched)
        assert (await client.get(VERIFY, headers=churner.headers)).status == 200
    for key in (victim, plain):
        assert await _statuses(client, key, VERIFY, 1) == [429]
