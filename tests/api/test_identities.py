"""Issue 36: identities through the real app on both backends: create, list (cursor
paging, ?externalId=), read, PATCH with ETag/If-Match, delete, their credits, the
permissions and escalation rule, and their activities."""

from typing import Any

from tests.helpers import (
    Client,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    create_creds,
    create_role,
)


def identities_url(creds: Creds, identity: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/identities"
    return base if identity is None else f"{base}/{identity}"


async def _create(client: Client, caller: Creds, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(identities_url(caller), json=body, headers=caller.headers)
    result: dict[str, Any] = await assert_ok(response)
    return result


LIMITS = [{"name": "tokens", "limit": 1000, "windowSeconds": 60, "autoApply": False}]


async def test_an_identity_is_created_read_and_listed(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    body = {
        "externalId": "customer-1",
        "meta": {"plan": "pro"},
        "credits": {"remaining": 100},
        "ratelimits": [{"name": "tokens", "limit": 1000, "windowSeconds": 60}],
    }
    made = await _create(client, admin, body)
    assert made["externalId"] == "customer-1"
    assert made["meta"] == {"plan": "pro"}
    assert made["credits"] == {"remaining": 100, "refill": None, "nextRefillAt": None}
    assert made["ratelimits"] == LIMITS
    assert made["createdAt"] == made["updatedAt"]
    response = await client.get(identities_url(admin, made["id"]), headers=admin.headers)
    assert await assert_ok(response) == made
    assert response.headers["ETag"].startswith('"')
    plain = await _create(client, admin, {"externalId": "customer-2"})
    assert plain["meta"] is None and plain["credits"] is None and plain["ratelimits"] == []
    listed = await client.get(identities_url(admin) + "?limit=1", headers=admin.headers)
    page = await listed.json()
    assert [i["id"] for i in page["result"]] == [made["id"]] and page["totalCount"] == 2
    rest = await client.get(
        identities_url(admin) + f"?limit=1&cursor={page['nextCursor']}", headers=admin.headers
    )
    second = await rest.json()
    assert [i["id"] for i in second["result"]] == [plain["id"]] and second["nextCursor"] is None
    only = await client.get(identities_url(admin) + "?externalId=customer-2", headers=admin.headers)
    assert [i["id"] for i in await assert_ok(only)] == [plain["id"]]
    none = await client.get(identities_url(admin) + "?externalId=nobody", headers=admin.headers)
    assert await assert_ok(none) == []


async def test_an_external_id_is_unique_in_its_organization(client: Client, admin: Creds) -> None:
    await _create(client, admin, {"externalId": "acme"})
    response = await client.post(
        identities_url(admin), json={"externalId": "acme"}, headers=admin.headers
    )
    await assert_error(
        response, 409, "externalId: this organization has an identity with this externalId already"
    )


async def test_bad_bodies_are_400s_that_name_the_field(client: Client, admin: Creds) -> None:
    cases = [
        ({}, "externalId: is required"),
        ({"externalId": ""}, "externalId: must be 1 to 255 characters"),
        ({"externalId": "a", "meta": []}, "meta: must be a JSON object"),
        ({"externalId": "a", "credits": {"remaining": -1}},
         "credits.remaining: must be an integer from 0 to 1000000000000"),
        ({"externalId": "a", "ratelimits": [LIMITS[0], LIMITS[0]]},
         "ratelimits: names must be unique"),
        ({"externalId": "a", "other": 1}, "other: is not a known field"),
    ]  # fmt: skip
    for body, message in cases:
        response = await client.post(identities_url(admin), json=body, headers=admin.headers)
        await assert_error(response, 400, message)
    patch = await _create(client, admin, {"externalId": "b"})
    response = await client.patch(
        identities_url(admin, patch["id"]), json={"externalId": "c"}, headers=admin.headers
    )
    await assert_error(response, 400, "externalId: is not a known field")


async def test_patch_replaces_clears_and_honours_if_match(client: Client, admin: Creds) -> None:
    made = await _create(client, admin, {"externalId": "p", "meta": {"a": 1}})
    url = identities_url(admin, made["id"])
    first = await client.get(url, headers=admin.headers)
    etag = first.headers["ETag"]
    changed = await client.patch(
        url, json={"ratelimits": LIMITS, "credits": {"remaining": 5}},
        headers={**admin.headers, "If-Match": etag},
    )  # fmt: skip
    after = await assert_ok(changed)
    assert after["ratelimits"] == LIMITS and after["credits"]["remaining"] == 5
    assert after["meta"] == {"a": 1} and changed.headers["ETag"] != etag
    stale = await client.patch(
        url, json={"meta": None}, headers={**admin.headers, "If-Match": etag}
    )
    assert stale.status == 412
    cleared = await assert_ok(
        await client.patch(url, json={"meta": None, "ratelimits": None}, headers=admin.headers)
    )
    assert cleared["meta"] is None and cleared["ratelimits"] == []


async def test_credits_are_set_incremented_and_decremented(client: Client, admin: Creds) -> None:
    made = await _create(client, admin, {"externalId": "c"})
    url = identities_url(admin, made["id"]) + "/credits"
    response = await client.post(url, json={"increment": 3}, headers=admin.headers)
    await assert_error(
        response, 409,
        'the identity\'s credits are unlimited: set a number first ({"set": n}), then increment'
        " or decrement it",
    )  # fmt: skip
    steps = [({"set": 10}, 10), ({"increment": 5}, 15), ({"decrement": 20}, 0)]
    for body, remaining in steps:
        result = await assert_ok(await client.post(url, json=body, headers=admin.headers))
        assert result["credits"]["remaining"] == remaining
    unlimited = await assert_ok(await client.post(url, json={"set": None}, headers=admin.headers))
    assert unlimited["credits"] is None


async def test_delete_removes_the_identity(client: Client, admin: Creds) -> None:
    made = await _create(client, admin, {"externalId": "d"})
    url = identities_url(admin, made["id"])
    stale = await client.delete(url, headers={**admin.headers, "If-Match": '"nope"'})
    assert stale.status == 412
    await assert_ok(await client.delete(url, headers=admin.headers))
    await assert_error(
        await client.get(url, headers=admin.headers), 404, "identity not found in this organization"
    )
    await assert_error(
        await client.delete(url, headers=admin.headers), 404,
        "identity not found in this organization",
    )  # fmt: skip


async def test_permissions_and_organization_are_checked(client: Client, admin: Creds) -> None:
    made = await _create(client, admin, {"externalId": "x"})
    reader_role = await create_role(
        client, admin, {"name": "id-reader", "permissions": ["identities:read"]}
    )
    reader = await create_creds(
        client, admin, {"name": "reader", "assignedRoleIds": [reader_role["id"]]}
    )
    assert (
        await client.get(identities_url(reader, made["id"]), headers=reader.headers)
    ).status == 200
    refused = await client.post(
        identities_url(reader), json={"externalId": "y"}, headers=reader.headers
    )
    assert refused.status == 403
    other = f"/v1/organizations/{'0' * 8}-0000-4000-8000-{'0' * 12}/identities"
    assert (await client.get(other, headers=admin.headers)).status == 403


async def test_a_weaker_key_cannot_change_a_stronger_keys_identity(
    client: Client, admin: Creds
) -> None:
    writer_role = await create_role(
        client, admin, {"name": "id-writer", "permissions": ["identities:write", "identities:read"]}
    )
    writer = await create_creds(
        client, admin, {"name": "writer", "assignedRoleIds": [writer_role["id"]]}
    )
    big = await _create(client, admin, {"externalId": "big"})
    await create_creds(client, admin, {"name": "strong", "roles": ["admin"], "externalId": "big"})
    url = identities_url(writer, big["id"])
    stronger = "cannot change this identity: one of its keys holds a permission this key lacks"
    for response in (
        await client.patch(url, json={"meta": {"a": 1}}, headers=writer.headers),
        await client.post(url + "/credits", json={"set": 1}, headers=writer.headers),
        await client.delete(url, headers=writer.headers),
    ):
        await assert_error(response, 403, stronger)
    mine = await _create(client, admin, {"externalId": "mine"})
    own = await create_creds(
        client, admin,
        {"name": "own", "assignedRoleIds": [writer_role["id"]], "externalId": "mine"},
    )  # fmt: skip
    response = await client.post(
        identities_url(own, mine["id"]) + "/credits", json={"set": 1}, headers=own.headers
    )
    await assert_error(
        response,
        403,
        "a key cannot change the credits or limits of its own identity: use another key",
    )


async def test_identity_writes_are_keysvc_activities(client: Client, admin: Creds) -> None:
    made = await _create(client, admin, {"externalId": "logged", "meta": {"v": 1}})
    url = identities_url(admin, made["id"])
    await assert_ok(await client.patch(url, json={"meta": {"v": 2}}, headers=admin.headers))
    await assert_ok(await client.delete(url, headers=admin.headers))
    log = f"/v1/organizations/{admin.organization_id}/activities"
    upstream = await assert_ok(await client.get(log, headers=admin.headers))
    assert not [a for a in upstream if a["type"].startswith("identity_")]
    everything = await assert_ok(await client.get(log + "?include=keysvc", headers=admin.headers))
    kinds = [a for a in everything if a["type"].startswith("identity_")]
    assert [a["type"] for a in kinds] == ["identity_create", "identity_update", "identity_delete"]
    assert kinds[0]["after"]["externalId"] == "logged"
    assert kinds[1]["before"] == {
        "identityId": made["id"],
        "externalId": "logged",
        "meta": {"v": 1},
    }
    assert kinds[1]["after"] == {"identityId": made["id"], "externalId": "logged", "meta": {"v": 2}}
    assert kinds[2]["before"]["meta"] == {"v": 2}


async def test_a_key_with_an_external_id_belongs_to_its_identity(
    client: Client, admin: Creds
) -> None:
    keys = f"/v1/organizations/{admin.organization_id}/keys"
    made = await assert_ok(
        await client.post(
            keys, json={"name": "a", "roles": ["developer"], "externalId": "cust"},
            headers=admin.headers,
        )
    )  # fmt: skip
    found = await assert_ok(
        await client.get(identities_url(admin) + "?externalId=cust", headers=admin.headers)
    )
    assert [i["externalId"] for i in found] == ["cust"] and found[0]["credits"] is None
    assert found[0]["ratelimits"] == [] and made["key"]["identityId"] == found[0]["id"]
    second = await assert_ok(
        await client.post(
            keys, json={"name": "b", "roles": ["developer"], "externalId": "cust"},
            headers=admin.headers,
        )
    )  # fmt: skip
    assert second["key"]["identityId"] == found[0]["id"]
    got = await assert_ok(await client.get(f"{keys}/{second['key']['id']}", headers=admin.headers))
    assert got["identityId"] == found[0]["id"]
    plain = await assert_ok(
        await client.post(keys, json={"name": "c", "roles": ["developer"]}, headers=admin.headers)
    )
    assert "identityId" not in plain["key"]
    patched = await assert_ok(
        await client.patch(
            f"{keys}/{plain['key']['id']}", json={"externalId": "later"}, headers=admin.headers
        )
    )
    later = await assert_ok(
        await client.get(identities_url(admin) + "?externalId=later", headers=admin.headers)
    )
    assert patched["identityId"] == later[0]["id"]
    # Deleting the identity leaves its keys and their externalId, sharing nothing.
    await assert_ok(
        await client.delete(identities_url(admin, found[0]["id"]), headers=admin.headers)
    )
    kept = await assert_ok(await client.get(f"{keys}/{second['key']['id']}", headers=admin.headers))
    assert kept["externalId"] == "cust" and "identityId" not in kept
    # PATCHing a key with that externalId again makes a new identity.
    again = await assert_ok(
        await client.patch(
            f"{keys}/{second['key']['id']}", json={"externalId": "cust"}, headers=admin.headers
        )
    )
    assert again["identityId"] not in (None, found[0]["id"])
