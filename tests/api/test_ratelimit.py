"""Request limits per key and failed-authentication limits per client address, through
the app."""

import asyncio
import ipaddress

import pytest

from keysvc.config import Settings
from keysvc.credentials import new_key_id, new_secret
from tests.helpers import (
    UNAUTHORIZED,
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    bootstrap,
    client_with,
    create_creds,
)

VERIFY = "/v1/verify"


async def test_per_key_limit_on_verify_and_management_alike(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    body = {
        "name": "limited",
        "roles": ["developer"],
        "rateLimit": {"limit": 3, "windowSeconds": 10},
    }
    created = await assert_ok(
        await client.post(
            f"/v1/organizations/{admin.organization_id}/keys", json=body, headers=admin.headers
        )
    )
    assert created["key"]["rateLimit"] == {"limit": 3, "windowSeconds": 10}
    key = Creds(admin.organization_id, created["key"]["id"], created["keyId"], created["keySecret"])
    clock.now = clock.now.replace(second=0, microsecond=0)  # a window start, for exact resets
    own = f"/v1/organizations/{admin.organization_id}/keys/{key.id}"
    first = await client.get(VERIFY, headers=key.headers)
    assert (first.status, first.headers["X-RateLimit-Remaining"]) == (200, "2")
    assert first.headers["X-RateLimit-Limit"] == "3"
    second = await client.get(own, headers=key.headers)  # the management API counts too
    await assert_ok(second)
    assert second.headers["X-RateLimit-Remaining"] == "1"
    assert (await client.get(VERIFY, headers=key.headers)).status == 200
    clock.advance(seconds=4)
    refused = await client.get(VERIFY, headers=key.headers)
    await assert_error(
        refused, 429, "rate limit exceeded for this key: 3 requests per 10 s; retry in 6 s"
    )
    assert refused.headers["Retry-After"] == "6"
    assert refused.headers["X-RateLimit-Reset"] == "6"
    assert refused.headers["X-RateLimit-Remaining"] == "0"
    message = "rate limit exceeded for this key: 3 requests per 10 s; retry in 6 s"
    await assert_error(await client.get(own, headers=key.headers), 429, message)
    clock.advance(seconds=6)
    assert (await client.get(VERIFY, headers=key.headers)).status == 200


async def test_rate_limit_patch_and_clear(client: Client, admin: Creds) -> None:
    key = await create_creds(client, admin, {"name": "k", "roles": ["developer"]})
    url = f"/v1/organizations/{admin.organization_id}/keys/{key.id}"
    patched = await assert_ok(
        await client.patch(
            url, json={"rateLimit": {"limit": 1, "windowSeconds": 60}}, headers=admin.headers
        )
    )
    assert patched["rateLimit"] == {"limit": 1, "windowSeconds": 60}
    assert (await client.get(VERIFY, headers=key.headers)).status == 200
    assert (await client.get(VERIFY, headers=key.headers)).status == 429
    cleared = await assert_ok(
        await client.patch(url, json={"rateLimit": None}, headers=admin.headers)
    )
    assert "rateLimit" not in cleared
    assert (await client.get(VERIFY, headers=key.headers)).status == 200


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ({"limit": 0, "windowSeconds": 10},
         "rateLimit.limit: must be an integer from 1 to 1000000"),
        ({"limit": 5, "windowSeconds": 0},
         "rateLimit.windowSeconds: must be an integer from 1 to 86400"),
        ({"limit": "5", "windowSeconds": 10}, "rateLimit.limit: Not a valid integer."),
        ({"limit": 5}, "rateLimit.windowSeconds: is required"),
    ],
)  # fmt: skip
async def test_bad_rate_limit(client: Client, admin: Creds, limit: object, message: str) -> None:
    response = await client.post(
        f"/v1/organizations/{admin.organization_id}/keys",
        json={"name": "k", "roles": ["developer"], "rateLimit": limit},
        headers=admin.headers,
    )
    await assert_error(response, 400, message)


async def test_server_default_limit_and_key_override(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, rate_limit=(2, 60))
    admin = await bootstrap(client.app)
    plain = await create_creds(client, admin, {"name": "plain", "roles": ["developer"]})
    roomy = await create_creds(
        client, admin,
        {"name": "roomy", "roles": ["developer"], "rateLimit": {"limit": 100, "windowSeconds": 60}},
    )  # fmt: skip
    statuses = [(await client.get(VERIFY, headers=plain.headers)).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    statuses = [(await client.get(VERIFY, headers=roomy.headers)).status for _ in range(5)]
    assert statuses == [200] * 5


async def test_failed_logins_block_the_address_even_for_valid_keys(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(
        aiohttp_client,
        settings,
        clock,
        auth_failures=3,
        trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),),
    )
    admin = await bootstrap(client.app)
    clock.now = clock.now.replace(second=0, microsecond=0)
    attacker = {"X-Forwarded-For": "198.51.100.66"}
    bystander = {"X-Forwarded-For": "198.51.100.67"}
    for _ in range(3):
        wrong = {**basic(admin.key_id, "keysvc_guess"), **attacker}
        await assert_error(await client.get(VERIFY, headers=wrong), 401, UNAUTHORIZED)
    clock.advance(seconds=20)
    blocked = await client.get(VERIFY, headers={**admin.headers, **attacker})
    await assert_error(
        blocked, 429, "too many failed authentications from this address: retry in 40 s"
    )
    assert blocked.headers["Retry-After"] == "40"
    # Another address is not affected, and the block ends with the window.
    assert (await client.get(VERIFY, headers={**admin.headers, **bystander})).status == 200
    clock.advance(seconds=40)
    assert (await client.get(VERIFY, headers={**admin.headers, **attacker})).status == 200


async def test_disabled_key_is_not_a_credential_failure(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, auth_failures=2)
    admin = await bootstrap(client.app)
    off = await create_creds(
        client, admin, {"name": "off", "roles": ["admin"], "state": "disabled"}
    )
    for _ in range(4):
        await assert_error(await client.get(VERIFY, headers=off.headers), 401, "key is disabled")
    assert (await client.get(VERIFY, headers=admin.headers)).status == 200


@pytest.mark.parametrize(
    ("changes", "guessers", "blocked", "spared"),
    [
        # The default IPv6 prefix, /64: guesses from hosts differing in the low 64 bits.
        ({}, [f"2001:db8:1:2:{n:x}:{n:x}::{n:x}" for n in range(1, 6)],
         "2001:db8:1:2:ffff:ffff:ffff:fffe", "2001:db8:1:3::1"),
        # A settable IPv4 prefix: /24 over loopback addresses.
        ({"throttle_prefix_v4": 24}, [f"127.0.0.{n}" for n in range(10, 15)],
         "127.0.0.99", "127.0.1.99"),
        # Mapped IPv4 is IPv4: counted by the IPv4 prefix, not the IPv6 one.
        ({"throttle_prefix_v4": 24}, [f"::ffff:198.51.100.{n}" for n in range(10, 15)],
         "198.51.100.200", "::ffff:198.51.101.1"),
    ],
)  # fmt: skip
async def test_failed_logins_are_counted_per_network(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    changes: dict[str, int],
    guessers: list[str],
    blocked: str,
    spared: str,
) -> None:
    """As many failures as the limit, each from another address of one network, block
    the whole network (valid credentials included), and no other."""
    client = await client_with(
        aiohttp_client,
        settings,
        clock,
        auth_failures=len(guessers),
        trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),),
        **changes,
    )
    admin = await bootstrap(client.app)
    clock.now = clock.now.replace(second=0, microsecond=0)
    for guesser in guessers:
        wrong = {**basic(new_key_id(), new_secret()), "X-Forwarded-For": guesser}
        await assert_error(await client.get(VERIFY, headers=wrong), 401, UNAUTHORIZED)
    refused = await client.get(VERIFY, headers={**admin.headers, "X-Forwarded-For": blocked})
    await assert_error(
        refused, 429, "too many failed authentications from this address: retry in 60 s"
    )
    spared_headers = {**admin.headers, "X-Forwarded-For": spared}
    assert (await client.get(VERIFY, headers=spared_headers)).status == 200


async def test_parallel_guesses_stop_at_the_limit(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    """Guesses sent all at once: no more than the limit are ever answered 401 in a
    window, however many are under way together (checked only before they wait, every
    guess in flight would pass the limit). Valid credentials sent all at once, many
    keys or one, from one address are all served: they wait for room, not refused."""
    client = await client_with(aiohttp_client, settings, clock, auth_failures=20)
    admin = await bootstrap(client.app)
    clock.now = clock.now.replace(second=0, microsecond=0)

    async def guess() -> int:
        response = await client.get(VERIFY, headers=basic(new_key_id(), new_secret()))
        await response.read()
        return response.status

    statuses = await asyncio.gather(*(guess() for _ in range(120)))
    assert sorted(statuses) == [401] * 20 + [429] * 100, statuses
    # The same address, valid credentials: still refused in this window...
    assert (await client.get(VERIFY, headers=admin.headers)).status == 429
    clock.advance(seconds=60)
    # ...and in the next, successes never add up to a block.
    token = basic(admin.key_id, admin.secret)["Authorization"].removeprefix("Basic ")
    for n in range(30):
        # Each header new to the process (spaces differ), so each is checked in full.
        fresh = {"Authorization": "Basic " + " " * n + token}
        assert (await client.get(VERIFY, headers=fresh)).status == 200
    assert len(await asyncio.gather(*(guess() for _ in range(19)))) == 19
    assert (await client.get(VERIFY, headers=admin.headers)).status == 200
    # Many keys' first requests at once, from one address: all served.
    many = [await create_creds(client, admin, {"name": f"k{n}", "roles": ["developer"]})
            for n in range(45)]  # fmt: skip

    async def first_use(creds: Creds) -> int:
        response = await client.get(VERIFY, headers=creds.headers)
        await response.read()
        return response.status

    assert await asyncio.gather(*(first_use(creds) for creds in many)) == [200] * 45
    # And one new header's burst of first requests.
    burst = {"Authorization": "Basic " + " " * 40 + token}

    async def valid() -> int:
        response = await client.get(VERIFY, headers=burst)
        await response.read()
        return response.status

    assert await asyncio.gather(*(valid() for _ in range(50))) == [200] * 50
