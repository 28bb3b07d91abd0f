"""Issue 36: an identity's named rate limits on /v1/verify, through the real app on both
backends: one count for all of its keys; a key's own limit of the same name counts
instead; a change to the identity's limits reaches the next verify; never reused."""

from typing import Any

from tests.helpers import Client, Creds, FakeClock, assert_error, assert_ok, create_creds

VERIFY = "/v1/verify"
JSON = {"Accept": "application/json"}
BURST = {"name": "burst", "limit": 3, "windowSeconds": 60, "autoApply": True}


def _identities(creds: Creds, identity: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/identities"
    return base if identity is None else f"{base}/{identity}"


async def _key(client: Client, admin: Creds, external_id: str, **extra: Any) -> Creds:
    body = {"name": "k", "roles": ["developer"], "externalId": external_id, **extra}
    return await create_creds(client, admin, body)


def _at_minute_start(clock: FakeClock) -> None:
    clock.now = clock.now.replace(second=0, microsecond=0)


async def test_an_identity_limit_is_one_count_for_all_its_keys(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    body = {"externalId": "cust", "ratelimits": [BURST]}
    await assert_ok(await client.post(_identities(admin), json=body, headers=admin.headers))
    first, second = await _key(client, admin, "cust"), await _key(client, admin, "cust")
    _at_minute_start(clock)
    statuses = []
    for key in (first, second, first, second):
        response = await client.get(VERIFY, headers=key.headers)
        statuses.append(response.status)
        if response.status == 200:
            assert response.headers["Cache-Control"] == "no-store"
    assert statuses == [200, 200, 200, 429]
    # Another key of the organization, without the identity, is not counted with them.
    other = await _key(client, admin, "someone-else")
    assert (await client.get(VERIFY, headers=other.headers)).status == 200


async def test_the_keys_own_limit_of_a_name_counts_instead(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    body = {"externalId": "cust", "ratelimits": [BURST]}
    await assert_ok(await client.post(_identities(admin), json=body, headers=admin.headers))
    roomy = await _key(client, admin, "cust", ratelimits=[{**BURST, "limit": 10}])
    _at_minute_start(clock)
    response = await client.get(VERIFY, headers={**roomy.headers, **JSON})
    checked = (await assert_ok(response))["ratelimits"]
    assert checked == [
        {"name": "burst", "limit": 10, "remaining": 9, "reset": 60, "exceeded": False}
    ]


async def test_a_change_to_the_identitys_limits_reaches_the_next_verify(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    created = await assert_ok(
        await client.post(_identities(admin), json={"externalId": "cust"}, headers=admin.headers)
    )
    key = await _key(client, admin, "cust")
    _at_minute_start(clock)
    for _ in range(4):  # no limit yet, and the verify is cached warm
        assert (await client.get(VERIFY, headers=key.headers)).status == 200
    one = {**BURST, "limit": 1}
    patched = await client.patch(
        _identities(admin, created["id"]), json={"ratelimits": [one]}, headers=admin.headers
    )
    await assert_ok(patched)
    assert (await client.get(VERIFY, headers=key.headers)).status == 200
    refused = await client.get(VERIFY, headers=key.headers)
    await assert_error(
        refused, 429, "rate limit burst exceeded for this key: 1 per 60 s; retry in 60 s"
    )
    cleared = await client.patch(
        _identities(admin, created["id"]), json={"ratelimits": None}, headers=admin.headers
    )
    await assert_ok(cleared)
    assert (await client.get(VERIFY, headers=key.headers)).status == 200
