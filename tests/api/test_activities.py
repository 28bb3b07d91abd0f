"""The activity log through the API: what each key and role write records, who is
named as its actor, the list's paging and date filters, its permission, and the uses
of a disabled key."""

import asyncio
from datetime import timedelta
from typing import Any

from keysvc.config import Settings
from keysvc.credentials import new_secret
from keysvc.domain.activities import MAX_USER_AGENT, bounded_user_agent
from keysvc.timeutil import to_text
from tests.helpers import (
    FAR_FUTURE,
    UNAUTHORIZED,
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    client_with,
    create,
    create_creds,
    create_role,
    hash_data,
)

SECRETS = ("keySecret", "keyId", "secret", "hash", "keyIdHash", "keySecretHash")


def url(creds: Creds, rest: str = "") -> str:
    return f"/v1/organizations/{creds.organization_id}/activities{rest}"


async def listed(client: Client, creds: Creds, query: str = "") -> list[dict[str, Any]]:
    """Every activity of the organization, through the pages."""
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = f"?limit=2&include=keysvc{query}" + (f"&cursor={cursor}" if cursor else "")
        response = await client.get(url(creds, params), headers=creds.headers)
        body = await response.json()
        assert response.status == 200, body
        found += body["result"]
        cursor = body["nextCursor"]
        if cursor is None:
            return found


def no_secret_in(value: object) -> None:
    text = repr(value)
    for word in SECRETS:
        assert f"'{word}'" not in text


async def test_bootstrap_and_a_create_are_recorded_with_their_actor(
    client: Client, admin: Creds
) -> None:
    made = await create(client, admin, {"name": "svc", "roles": ["developer"]})
    headers = {**admin.headers, "User-Agent": "tester/1.0"}
    await assert_ok(
        await client.patch(
            f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}",
            json={"name": "svc2"},
            headers=headers,
        )
    )
    boot, created, renamed = await listed(client, admin)
    assert boot["type"] == "key_create" and boot["actorType"] == "system"
    assert boot["targetKeyId"] == admin.id and "actorId" not in boot
    assert created["type"] == "key_create" and created["keyUpdateType"] == "created"
    assert created["actorType"] == "api" and created["actorId"] == admin.id
    assert created["actorIpAddress"] == "127.0.0.1"
    assert created["organizationId"] == admin.organization_id
    assert created["targetKeyId"] == made["key"]["id"]
    assert created["after"]["name"] == "svc"
    assert created["after"]["assignedRoles"][0]["roleName"] == "developer"
    no_secret_in(created)
    assert made["keyId"] not in repr(created) and made["keySecret"] not in repr(created)
    assert renamed["userAgent"] == "tester/1.0"
    assert (renamed["before"], renamed["after"]) == ({"name": "svc"}, {"name": "svc2"})
    one = await assert_ok(await client.get(url(admin, f"/{created['id']}"), headers=admin.headers))
    assert one == created


async def test_a_patch_records_one_activity_per_kind_of_change(
    client: Client, admin: Creds
) -> None:
    key = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    path = f"/v1/organizations/{admin.organization_id}/keys/{key['id']}"
    before = len(await listed(client, admin))
    body = {
        "name": "k2",
        "state": "disabled",
        "expireAt": FAR_FUTURE,
        "ipAccessList": [{"source": "10.0.0.0/8", "description": "office"}],
        "roles": ["query_endpoints"],
        "rateLimit": {"limit": 5, "windowSeconds": 10},
    }
    await assert_ok(await client.patch(path, json=body, headers=admin.headers))
    changes = (await listed(client, admin))[before:]
    assert {c["type"] for c in changes} == {"openapi_key_update"}
    assert sorted(c["keyUpdateType"] for c in changes) == sorted(
        [
            "name-changed",
            "state-changed",
            "date-changed",
            "ip-access-list-changed",
            "role-changed",
            "rate-limit-changed",
        ]
    )
    by_type = {c["keyUpdateType"]: c for c in changes}
    assert by_type["state-changed"]["before"] == {"state": "enabled"}
    assert by_type["state-changed"]["after"] == {"state": "disabled"}
    assert by_type["rate-limit-changed"]["after"] == {
        "rateLimit": {"limit": 5, "windowSeconds": 10}
    }
    # The same values again change nothing, and record nothing.
    await assert_ok(await client.patch(path, json=body, headers=admin.headers))
    assert len(await listed(client, admin)) == before + 6


async def test_deletes_and_role_events_are_recorded(client: Client, admin: Creds) -> None:
    key = (await create(client, admin, {"name": "gone", "roles": ["developer"]}))["key"]
    orgs = f"/v1/organizations/{admin.organization_id}"
    await assert_ok(await client.delete(f"{orgs}/keys/{key['id']}", headers=admin.headers))
    role = await create_role(client, admin, {"name": "r", "permissions": ["keys:read"]})
    await assert_ok(
        await client.patch(f"{orgs}/roles/{role['id']}", json={"name": "r2"}, headers=admin.headers)
    )
    await assert_ok(  # no change: nothing recorded
        await client.patch(f"{orgs}/roles/{role['id']}", json={"name": "r2"}, headers=admin.headers)
    )
    await assert_ok(await client.delete(f"{orgs}/roles/{role['id']}", headers=admin.headers))
    deleted, made, renamed, removed = (await listed(client, admin))[-4:]
    assert deleted["type"] == "key_delete" and deleted["keyUpdateType"] == "deleted"
    assert deleted["before"]["name"] == "gone" and "after" not in deleted
    assert made["type"] == "role_create" and made["targetRoleId"] == role["id"]
    assert made["after"] == {"name": "r", "permissions": ["keys:read"], "actors": []}
    assert renamed["type"] == "role_update"
    assert (renamed["before"], renamed["after"]) == ({"name": "r"}, {"name": "r2"})
    assert removed["type"] == "role_delete" and removed["before"]["name"] == "r2"


async def test_paging_and_dates(client: Client, admin: Creds, clock: FakeClock) -> None:
    for n in range(4):
        await create(client, admin, {"name": f"k{n}", "roles": ["developer"]})
    first = await client.get(url(admin, "?limit=2"), headers=admin.headers)
    body = await first.json()
    assert len(body["result"]) == 2 and body["totalCount"] == 5 and body["nextCursor"]
    everything = await listed(client, admin)
    assert len(everything) == 5 and len({a["id"] for a in everything}) == 5
    start = "2000-01-01T00:00:00Z"
    assert len(await listed(client, admin, f"&from_date={start}&to_date={FAR_FUTURE}")) == 5
    assert await listed(client, admin, f"&from_date={FAR_FUTURE}") == []
    assert await listed(client, admin, f"&to_date={start}") == []
    created = everything[2]["createdAt"]
    exact = await listed(client, admin, f"&from_date={created}&to_date={created}")
    assert everything[2] in exact
    await assert_error(
        await client.get(url(admin, f"?from_date={FAR_FUTURE}&to_date={start}"),
                         headers=admin.headers),
        400,
        "from_date: must not be after to_date",
    )  # fmt: skip
    bad = await client.get(url(admin, "?from_date=yesterday"), headers=admin.headers)
    assert bad.status == 400 and "from_date" in (await bad.json())["error"]
    forged = await client.get(url(admin, "?cursor=1.abc"), headers=admin.headers)
    assert forged.status == 400


async def test_reading_needs_activities_read_in_the_organization(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    await assert_error(
        await client.get(url(admin), headers=dev.headers),
        403,
        "this key lacks the permission activities:read",
    )
    await assert_error(
        await client.get(url(admin), headers=other_admin.headers),
        403,
        "this key does not belong to the organization in the path",
    )
    mine = (await listed(client, admin))[0]
    missing = await client.get(url(other_admin, f"/{mine['id']}"), headers=other_admin.headers)
    await assert_error(missing, 404, "activity not found in this organization")
    role = await create_role(client, admin, {"name": "auditor", "permissions": ["activities:read"]})
    auditor = await create_creds(client, admin, {"name": "a", "assignedRoleIds": [role["id"]]})
    assert len(await listed(client, auditor)) >= 3


async def test_a_create_refused_in_its_batch_records_nothing(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, max_keys_per_org=3)
    admin = await bootstrap(client.app)
    posts = [
        client.post(
            f"/v1/organizations/{admin.organization_id}/keys",
            json={"name": f"k{n}", "roles": ["developer"]},
            headers=admin.headers,
        )
        for n in range(5)
    ]
    answers = await asyncio.gather(*posts)
    assert sorted(a.status for a in answers) == [200, 200, 409, 409, 409]
    created = [a for a in await listed(client, admin) if a["type"] == "key_create"]
    assert len(created) == 3  # bootstrap's and the two made


async def test_a_create_refused_by_a_constraint_in_its_batch_records_nothing(
    client: Client, admin: Creds
) -> None:
    """A taken key ID sends the batch a key at a time (each in a savepoint): the refused
    create's activity goes with its key, the others' stay."""
    taken = hash_data("same-key-id", "secret")
    posts = [
        client.post(
            f"/v1/organizations/{admin.organization_id}/keys",
            json={"name": f"k{n}", "roles": ["developer"], "hashData": taken},
            headers=admin.headers,
        )
        for n in range(2)
    ] + [
        client.post(
            f"/v1/organizations/{admin.organization_id}/keys",
            json={"name": "other", "roles": ["developer"]},
            headers=admin.headers,
        )
    ]
    answers = await asyncio.gather(*posts)
    assert sorted(a.status for a in answers) == [200, 200, 409]
    made = {(await a.json())["result"]["key"]["id"] for a in answers if a.status == 200}
    created = [a for a in await listed(client, admin) if a["type"] == "key_create"][1:]
    assert {a["targetKeyId"] for a in created} == made


async def test_a_disabled_key_used_is_recorded_once_a_minute(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    path = f"/v1/organizations/{admin.organization_id}/keys/{dev.id}"
    await assert_ok(await client.patch(path, json={"state": "disabled"}, headers=admin.headers))
    headers = {**dev.headers, "User-Agent": "x" * 3000}
    for _ in range(20):
        await assert_error(await client.get("/v1/whoami", headers=headers), 401, "key is disabled")

    async def uses() -> list[dict[str, Any]]:
        return [a for a in await listed(client, admin) if a["type"] == "key_used_after_revoke"]

    for _ in range(200):  # written off the request's path: wait for it
        if await uses():
            break
        await asyncio.sleep(0.05)
    (use,) = await uses()
    assert use["actorId"] == dev.id and use["targetKeyId"] == dev.id
    assert len(use["userAgent"]) == MAX_USER_AGENT and set(use["userAgent"]) == {"x"}
    clock.advance(minutes=1)
    await assert_error(await client.get("/v1/whoami", headers=headers), 401, "key is disabled")
    for _ in range(200):
        if len(await uses()) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(await uses()) == 2
    # A wrong secret for the same key is no activity (a failed authentication).
    wrong = Creds(dev.organization_id, dev.id, dev.key_id, new_secret())  # another valid secret
    await assert_error(await client.get("/v1/whoami", headers=wrong.headers), 401, UNAUTHORIZED)
    clock.advance(minutes=1)
    await asyncio.sleep(0.2)
    assert len(await uses()) == 2


def test_a_user_agent_is_bounded_and_made_safe_to_store_and_show() -> None:
    """What a raw header may carry that the client above cannot send: control
    characters, and a lone surrogate from bytes that were not UTF-8."""
    kept = bounded_user_agent("a\x1b[2J\x7f\r\nb\udcff" + "z" * 1000)
    assert kept is not None and len(kept) == MAX_USER_AGENT
    assert kept.startswith("a\ufffd[2J\ufffd\ufffd\ufffdb?z")
    kept.encode("utf-8")  # storable
    assert bounded_user_agent("") is None and bounded_user_agent(None) is None


async def test_a_user_agent_cannot_break_the_record(client: Client, admin: Creds) -> None:
    agent = "évil \u202e" + "y" * 600
    headers = {**admin.headers, "User-Agent": agent}
    made = await client.post(
        f"/v1/organizations/{admin.organization_id}/keys",
        json={"name": "ua", "roles": ["developer"]},
        headers=headers,
    )
    await assert_ok(made)
    record = (await listed(client, admin))[-1]
    assert len(record["userAgent"]) == MAX_USER_AGENT
    assert record["userAgent"] == agent[:MAX_USER_AGENT]


async def test_dates_select_by_the_time_of_each_write(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    """Every write records the server's time (its clock): create, PATCH, delete and role
    writes alike, and from_date and to_date select by it, both ends included."""
    orgs = f"/v1/organizations/{admin.organization_id}"
    clock.advance(days=10)
    key = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    clock.advance(days=10)
    await assert_ok(
        await client.patch(f"{orgs}/keys/{key['id']}", json={"name": "k2"}, headers=admin.headers)
    )
    clock.advance(days=10)
    await assert_ok(await client.delete(f"{orgs}/keys/{key['id']}", headers=admin.headers))
    clock.advance(days=10)
    await create_role(client, admin, {"name": "r"})
    _, *writes = await listed(client, admin)
    assert [w["type"] for w in writes] == [
        "key_create", "openapi_key_update", "key_delete", "role_create"
    ]  # fmt: skip
    times = [w["createdAt"] for w in writes]
    assert times == sorted(times) and len(set(times)) == 4
    assert times[-1] == to_text(clock.now)
    middle = await listed(client, admin, f"&from_date={times[1]}&to_date={times[2]}")
    assert [w["id"] for w in middle] == [w["id"] for w in writes[1:3]]
    later = await listed(client, admin, f"&from_date={times[1].replace('Z', '%2B02:00')}")
    # Two hours before the PATCH, in UTC: the PATCH and what followed, not the create.
    assert [w["id"] for w in later] == [w["id"] for w in writes[1:]]


async def test_a_rotation_is_recorded_with_its_suffixes_and_grace(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    rotate = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}/rotate"
    first = await assert_ok(
        await client.post(rotate, json={"gracePeriodSeconds": 60}, headers=admin.headers)
    )
    second = await assert_ok(await client.post(rotate, headers=admin.headers))
    one, two = (await listed(client, admin))[-2:]
    for activity in (one, two):
        assert activity["type"] == "openapi_key_update"
        assert activity["keyUpdateType"] == "key-rotated"
        assert activity["targetKeyId"] == svc.id and activity["actorId"] == admin.id
        no_secret_in(activity)
    grace_end = to_text(clock() + timedelta(seconds=60))
    assert one["before"] == {"keySuffix": svc.key_id[-4:], "previousCredentialExpiresAt": None}
    assert one["after"] == {
        "keySuffix": first["keyId"][-4:],
        "previousCredentialExpiresAt": grace_end,
    }
    assert two["before"] == one["after"]  # the second rotation ends the first's grace
    assert two["after"] == {
        "keySuffix": second["keyId"][-4:],
        "previousCredentialExpiresAt": None,
    }
