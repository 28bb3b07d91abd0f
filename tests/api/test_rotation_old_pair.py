"""A rotated key's previous key ID and secret, once their grace has ended: answered 401
"key is rotated", on verify and the management API alike, and never counted as a failed
login, so that clients still retrying with them do not lock the new pair out of their
address. Only the right secret gets that answer: a wrong one with the old key ID is an
ordinary failed login, answered and counted as an unknown key ID is."""

import ipaddress

from keysvc.config import Settings
from tests.api.rotation import rotate, works
from tests.helpers import (
    ROTATED,
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

FAILURES = 3
ADDRESS = {"X-Forwarded-For": "198.51.100.66"}


async def started(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> tuple[Client, Creds, Creds]:
    """A client of an app that refuses an address after FAILURES failed logins (behind
    the test's proxy, 127.0.0.1), its admin key, and a developer key to rotate."""
    client = await client_with(
        aiohttp_client,
        settings,
        clock,
        auth_failures=FAILURES,
        trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),),
    )
    # At a window's start, so that the whole test runs in one failed-login window.
    clock.now = clock.now.replace(second=0, microsecond=0)
    admin = await bootstrap(client.app)
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    return client, admin, svc


def paths(caller: Creds) -> list[str]:
    """Forward auth, and two management routes."""
    return ["/v1/verify", "/v1/whoami", f"/v1/organizations/{caller.organization_id}/keys"]


async def assert_rotated(client: Client, creds: Creds, path: str = "/v1/whoami") -> None:
    response = await client.get(path, headers={**creds.headers, **ADDRESS})
    await assert_error(response, 401, ROTATED)
    assert response.headers["WWW-Authenticate"] == 'Basic realm="keysvc"'


async def test_old_pair_after_grace_is_rotated_and_never_locks_out_the_new_pair(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client, admin, old = await started(aiohttp_client, settings, clock)
    new, _ = await rotate(client, admin, old, {"gracePeriodSeconds": 1})
    clock.advance(seconds=2)
    for _ in range(FAILURES + 2):
        for path in paths(old):
            await assert_rotated(client, old, path)
    for path in paths(new):
        assert (await client.get(path, headers={**new.headers, **ADDRESS})).status == 200

    # A wrong secret with the old key ID is an ordinary failed login, and counts.
    for _ in range(FAILURES):
        wrong = {**basic(old.key_id, new.secret), **ADDRESS}
        await assert_error(await client.get("/v1/verify", headers=wrong), 401, UNAUTHORIZED)
    blocked = await client.get("/v1/verify", headers={**new.headers, **ADDRESS})
    await assert_error(
        blocked, 429, "too many failed authentications from this address: retry in 58 s"
    )
    assert (await client.get("/v1/verify", headers=new.headers)).status == 200


async def test_old_pair_in_its_grace_still_works(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client, admin, old = await started(aiohttp_client, settings, clock)
    new, _ = await rotate(client, admin, old, {"gracePeriodSeconds": 60})
    assert await works(client, old) and await works(client, new)
    clock.advance(seconds=60)
    await assert_rotated(client, old)
    assert await works(client, new)


async def test_credentials_that_stop_at_once_are_rotated_too(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client, admin, first = await started(aiohttp_client, settings, clock)
    # No grace: the first pair stops at once.
    second, _ = await rotate(client, admin, first, {"gracePeriodSeconds": 0})
    # A grace: the second pair is kept, then a third rotation ends it at once.
    third, _ = await rotate(client, admin, second, {"gracePeriodSeconds": 3600})
    fourth, _ = await rotate(client, admin, third, {"gracePeriodSeconds": 3600})
    for _ in range(FAILURES + 1):
        await assert_rotated(client, first)
        await assert_rotated(client, second)
    assert await works(client, third) and await works(client, fourth)


async def test_deleted_key_old_pair_is_unknown(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client, admin, old = await started(aiohttp_client, settings, clock)
    new, _ = await rotate(client, admin, old, {"gracePeriodSeconds": 0})
    await assert_rotated(client, old)
    path = f"/v1/organizations/{admin.organization_id}/keys/{old.id}"
    await assert_ok(await client.delete(path, headers=admin.headers))
    assert not await works(client, old)
    assert not await works(client, new)
