"""Issue 29: credits on keys through the real app on both backends: set on create and
PATCH, shown by GET with their refill and next refill, refilled lazily on read at
00:00 UTC, and changed without a race by POST .../credits."""

from datetime import UTC, datetime, timedelta
from typing import Any

from keysvc.domain.credits import MAX_CREDITS
from tests.helpers import (
    Client,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    create,
    create_creds,
    create_role,
    get_key,
    keys_url,
)


def _midnight_after(moment: datetime) -> str:
    day = (moment + timedelta(days=1)).date()
    return f"{day.isoformat()}T00:00:00Z"


async def _credits(client: Client, admin: Creds, key_id: str, body: dict[str, Any]) -> Any:
    return await client.post(keys_url(admin, key_id) + "/credits", json=body, headers=admin.headers)


async def test_create_and_read_credits(client: Client, admin: Creds, clock: FakeClock) -> None:
    body = {
        "name": "metered",
        "roles": ["developer"],
        "credits": {"remaining": 5, "refill": {"interval": "daily", "amount": 20}},
    }
    key = (await create(client, admin, body))["key"]
    want = {
        "remaining": 5,
        "refill": {"interval": "daily", "amount": 20, "refillDay": 1},
        "nextRefillAt": _midnight_after(clock.now),
    }
    assert key["credits"] == want
    assert (await get_key(client, admin, key["id"]))["credits"] == want
    plain = await create(
        client, admin, {"name": "n", "roles": ["developer"], "credits": {"remaining": 0}}
    )
    assert plain["key"]["credits"] == {"remaining": 0, "refill": None, "nextRefillAt": None}


async def test_monthly_refill_day_defaults_and_validation(client: Client, admin: Creds) -> None:
    base = {"name": "m", "roles": ["developer"]}
    monthly = {"remaining": 1, "refill": {"interval": "monthly", "amount": 3}}
    key = (await create(client, admin, {**base, "credits": monthly}))["key"]
    assert key["credits"]["refill"] == {"interval": "monthly", "amount": 3, "refillDay": 1}
    assert key["credits"]["nextRefillAt"].endswith("-01T00:00:00Z")
    cases = [
        ({"remaining": -1}, "credits.remaining: must be an integer from 0 to 1000000000000"),
        ({"remaining": "5"}, "credits.remaining: Not a valid integer."),
        ({}, "credits.remaining: is required"),
        (
            {"remaining": 1, "refill": {"interval": "weekly", "amount": 1}},
            "credits.refill.interval: must be one of: daily, monthly",
        ),
        (
            {"remaining": 1, "refill": {"interval": "daily", "amount": 0}},
            "credits.refill.amount: must be an integer from 1 to 1000000000000",
        ),
        (
            {"remaining": 1, "refill": {"interval": "monthly", "amount": 1, "refillDay": 32}},
            "credits.refill.refillDay: must be an integer from 1 to 31",
        ),
        (
            {"remaining": 1, "refill": {"interval": "daily", "amount": 1, "refillDay": 3}},
            "credits.refill.refillDay: is for a monthly refill only",
        ),
    ]
    for credits, message in cases:
        response = await client.post(
            keys_url(admin), json={**base, "credits": credits}, headers=admin.headers
        )
        await assert_error(response, 400, message)


async def test_a_refill_is_applied_on_read_at_midnight(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    body = {
        "name": "daily",
        "roles": ["developer"],
        "credits": {"remaining": 2, "refill": {"interval": "daily", "amount": 9}},
    }
    key = (await create(client, admin, body))["key"]
    midnight = datetime.fromisoformat(key["credits"]["nextRefillAt"])
    clock.now = midnight - timedelta(microseconds=1)
    assert (await get_key(client, admin, key["id"]))["credits"]["remaining"] == 2
    before = await _listed(client, admin, key["id"])  # a page kept from before midnight
    assert (before["remaining"], before["nextRefillAt"]) == (2, _midnight_after(clock.now))
    clock.now = midnight
    # The list shows the refill: the page kept from before midnight is not served.
    listed = await _listed(client, admin, key["id"])
    assert (listed["remaining"], listed["nextRefillAt"]) == (9, _midnight_after(midnight))
    got = (await get_key(client, admin, key["id"]))["credits"]
    assert got["remaining"] == 9
    assert got["nextRefillAt"] == _midnight_after(midnight)
    clock.now = midnight + timedelta(days=3)
    assert (await _listed(client, admin, key["id"]))["nextRefillAt"] == _midnight_after(clock.now)


async def _listed(client: Client, admin: Creds, key_id: str) -> Any:
    """The key's credits as the first page of the key list shows them."""
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    (mine,) = [k for k in listed if k["id"] == key_id]
    return mine["credits"]


async def test_set_increment_decrement(client: Client, admin: Creds) -> None:
    key = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    assert "credits" not in key
    await assert_error(
        await _credits(client, admin, key["id"], {"increment": 5}),
        409,
        'the key\'s credits are unlimited: set a number first ({"set": n}), then increment'
        " or decrement it",
    )
    got = await assert_ok(await _credits(client, admin, key["id"], {"set": 10}))
    assert got["credits"] == {"remaining": 10, "refill": None, "nextRefillAt": None}
    got = await assert_ok(await _credits(client, admin, key["id"], {"increment": 5}))
    assert got["credits"]["remaining"] == 15
    got = await assert_ok(await _credits(client, admin, key["id"], {"decrement": 4}))
    assert got["credits"]["remaining"] == 11
    got = await assert_ok(await _credits(client, admin, key["id"], {"decrement": 400}))
    assert got["credits"]["remaining"] == 0
    got = await assert_ok(await _credits(client, admin, key["id"], {"set": None}))
    assert "credits" not in got
    assert "credits" not in await get_key(client, admin, key["id"])


async def test_an_increment_past_the_maximum_is_refused_and_changes_nothing(
    client: Client, admin: Creds
) -> None:
    top = MAX_CREDITS - 5
    body = {"name": "k", "roles": ["developer"], "credits": {"remaining": top}}
    key = (await create(client, admin, body))["key"]
    await assert_error(
        await _credits(client, admin, key["id"], {"increment": 6}),
        409,
        f"increment: 6 would take remaining from {top} past the maximum, {MAX_CREDITS};"
        " nothing was changed (increment by at most 5)",
    )
    assert (await get_key(client, admin, key["id"]))["credits"]["remaining"] == top
    url = f"/v1/organizations/{admin.organization_id}/activities?include=keysvc"
    records = await assert_ok(await client.get(url, headers=admin.headers))
    assert [r for r in records if r.get("keyUpdateType") == "credits-changed"] == []
    # Up to the maximum exactly is taken.
    got = await assert_ok(await _credits(client, admin, key["id"], {"increment": 5}))
    assert got["credits"]["remaining"] == MAX_CREDITS


async def test_if_match_covers_an_admins_credit_change_and_not_a_spend(
    client: Client, admin: Creds
) -> None:
    """A PATCH of credits with the ETag read before another admin's POST .../credits is
    refused (412), not laid over it; a spend leaves the ETag as it was."""
    body = {"name": "k", "roles": ["developer"], "credits": {"remaining": 10}}
    user = await create_creds(client, admin, body)
    url = keys_url(admin, user.id)
    read = await client.get(url, headers=admin.headers)
    stale = read.headers["ETag"]
    added = await _credits(client, admin, user.id, {"increment": 5})
    assert (await assert_ok(added))["credits"]["remaining"] == 15
    assert added.headers["ETag"] != stale
    patch = {"credits": {"remaining": 3}}
    await assert_error(
        await client.patch(url, json=patch, headers={**admin.headers, "If-Match": stale}),
        412,
        "the key has changed since you read it (If-Match does not match its ETag)",
    )
    assert (await get_key(client, admin, user.id))["credits"]["remaining"] == 15
    # Spends move remaining, not the ETag: an If-Match read before them still applies.
    current = added.headers["ETag"]
    for _ in range(2):
        assert (
            await client.get("/v1/verify", headers=basic(user.key_id, user.secret))
        ).status == 200
    read = await client.get(url, headers=admin.headers)
    assert ((await assert_ok(read))["credits"]["remaining"], read.headers["ETag"]) == (13, current)
    patched = await client.patch(url, json=patch, headers={**admin.headers, "If-Match": current})
    assert (await assert_ok(patched))["credits"]["remaining"] == 3
    assert patched.headers["ETag"] != current


async def test_a_set_keeps_the_refill(client: Client, admin: Creds) -> None:
    refill = {"interval": "monthly", "amount": 50, "refillDay": 31}
    body = {"name": "k", "roles": ["developer"], "credits": {"remaining": 1, "refill": refill}}
    key = (await create(client, admin, body))["key"]
    got = await assert_ok(await _credits(client, admin, key["id"], {"set": 7}))
    assert got["credits"]["refill"] == refill
    assert got["credits"]["remaining"] == 7
    # PATCH replaces them whole, refill included; null makes them unlimited.
    patched = await assert_ok(
        await client.patch(
            keys_url(admin, key["id"]), json={"credits": {"remaining": 3}}, headers=admin.headers
        )
    )
    assert patched["credits"] == {"remaining": 3, "refill": None, "nextRefillAt": None}
    patched = await assert_ok(
        await client.patch(
            keys_url(admin, key["id"]), json={"credits": None}, headers=admin.headers
        )
    )
    assert "credits" not in patched


async def test_the_body_takes_exactly_one(client: Client, admin: Creds) -> None:
    key = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    only_one = "set: give exactly one of set, increment, decrement"
    for body, message in (
        ({}, only_one),
        ({"set": 1, "increment": 1}, only_one),
        ({"increment": 0}, "increment: must be an integer from 1 to 1000000000000"),
        ({"decrement": -1}, "decrement: must be an integer from 1 to 1000000000000"),
        ({"set": -1}, "set: must be an integer from 0 to 1000000000000"),
        ({"add": 1}, "add: is not a known field"),
    ):
        await assert_error(await _credits(client, admin, key["id"], body), 400, message)
    unknown = "00000000-0000-4000-8000-000000000000"
    await assert_error(
        await _credits(client, admin, unknown, {"set": 1}),
        404,
        "key not found in this organization",
    )


async def test_it_needs_keys_update_and_not_ones_own(client: Client, admin: Creds) -> None:
    target = (await create(client, admin, {"name": "t", "roles": ["developer"]}))["key"]
    role = await create_role(client, admin, {"name": "reader", "permissions": ["keys:read"]})
    reader = await create_creds(client, admin, {"name": "r", "assignedRoleIds": [role["id"]]})
    response = await _credits(client, reader, target["id"], {"set": 1})
    assert response.status == 403
    await assert_error(
        await _credits(client, admin, admin.id, {"set": 1}),
        403,
        "a key cannot change its own credits: use another key to change them",
    )


async def test_changes_are_recorded(client: Client, admin: Creds) -> None:
    key = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    await assert_ok(await _credits(client, admin, key["id"], {"set": 10}))
    await assert_ok(await _credits(client, admin, key["id"], {"increment": 2}))
    url = f"/v1/organizations/{admin.organization_id}/activities?include=keysvc"
    records = await assert_ok(await client.get(url, headers=admin.headers))
    changes = [
        (r["before"]["credits"], r["after"]["credits"])
        for r in records
        if r.get("keyUpdateType") == "credits-changed" and r.get("targetKeyId") == key["id"]
    ]
    plain = {"refill": None, "nextRefillAt": None}
    assert (None, {"remaining": 10, **plain}) in changes
    assert ({"remaining": 10, **plain}, {"remaining": 12, **plain}) in changes


async def test_the_day_is_utc(client: Client, admin: Creds, clock: FakeClock) -> None:
    clock.now = datetime(2026, 1, 31, 23, 30, tzinfo=UTC)
    refill = {"interval": "monthly", "amount": 4, "refillDay": 31}
    body = {"name": "k", "roles": ["developer"], "credits": {"remaining": 0, "refill": refill}}
    key = (await create(client, admin, body))["key"]
    assert key["credits"]["nextRefillAt"] == "2026-02-28T00:00:00Z"
    clock.now = datetime(2026, 2, 28, 0, 0, tzinfo=UTC)
    got = (await get_key(client, admin, key["id"]))["credits"]
    assert (got["remaining"], got["nextRefillAt"]) == (4, "2026-03-31T00:00:00Z")
