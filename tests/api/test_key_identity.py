"""Issue 29: a key's externalId and meta, through the real app on both backends: set on
create, changed and cleared by PATCH, read back by GET and the list, the list's
?externalId= filter, the validation, and the activities that record the changes."""

import json
from typing import Any

from tests.api.activities import key_updates
from tests.helpers import (
    Client,
    Creds,
    assert_error,
    assert_ok,
    create,
    get_key,
    keys_url,
)

HIDDEN = "must not contain invisible or formatting characters such as U+202E"
META = {"plan": "pro", "seats": 5, "nested": {"a": [1, 2, None]}, "ünï": "çødé"}


async def _patch(client: Client, admin: Creds, key_id: str, body: dict[str, Any]) -> Any:
    return await client.patch(keys_url(admin, key_id), json=body, headers=admin.headers)


async def test_external_id_and_meta_round_trip(client: Client, admin: Creds) -> None:
    body = {"name": "tenant key", "roles": ["developer"], "externalId": " cust_42 ", "meta": META}
    made = (await create(client, admin, body))["key"]
    assert made["externalId"] == "cust_42"  # trimmed, as a name is
    assert made["meta"] == META
    got = await get_key(client, admin, made["id"])
    assert got["externalId"] == "cust_42"
    assert got["meta"] == META
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    assert [k["meta"] for k in listed if k["id"] == made["id"]] == [META]


async def test_keys_without_them_answer_as_before(client: Client, admin: Creds) -> None:
    made = (await create(client, admin, {"name": "plain", "roles": ["developer"]}))["key"]
    got = await get_key(client, admin, made["id"])
    assert not {"externalId", "meta", "credits"} & set(got)


async def test_patch_changes_and_clears_them(client: Client, admin: Creds) -> None:
    made = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    changed = await assert_ok(
        await _patch(client, admin, made["id"], {"externalId": "cust_1", "meta": {"a": 1}})
    )
    assert (changed["externalId"], changed["meta"]) == ("cust_1", {"a": 1})
    # A PATCH of the name leaves them as they are.
    renamed = await assert_ok(await _patch(client, admin, made["id"], {"name": "k2"}))
    assert (renamed["externalId"], renamed["meta"]) == ("cust_1", {"a": 1})
    cleared = await assert_ok(
        await _patch(client, admin, made["id"], {"externalId": None, "meta": None})
    )
    assert "externalId" not in cleared and "meta" not in cleared
    assert "externalId" not in await get_key(client, admin, made["id"])


async def test_the_list_filters_by_external_id(client: Client, admin: Creds) -> None:
    ids = {}
    for name, external in (("a1", "cust_a"), ("b", "cust_b"), ("a2", "cust_a"), ("none", None)):
        body: dict[str, Any] = {"name": name, "roles": ["developer"]}
        if external:
            body["externalId"] = external
        ids[name] = (await create(client, admin, body))["key"]["id"]
    response = await client.get(keys_url(admin) + "?externalId=cust_a", headers=admin.headers)
    raw = await response.json()
    assert [k["id"] for k in raw["result"]] == [ids["a1"], ids["a2"]]
    assert raw["totalCount"] == 2
    # Paged: one at a time, the cursor carries on within the filter.
    first = await (
        await client.get(keys_url(admin) + "?externalId=cust_a&limit=1", headers=admin.headers)
    ).json()
    assert [k["id"] for k in first["result"]] == [ids["a1"]]
    after = f"?externalId=cust_a&limit=1&cursor={first['nextCursor']}"
    second = await (await client.get(keys_url(admin) + after, headers=admin.headers)).json()
    assert [k["id"] for k in second["result"]] == [ids["a2"]]
    assert second["nextCursor"] is None
    none = await (
        await client.get(keys_url(admin) + "?externalId=nobody", headers=admin.headers)
    ).json()
    assert (none["result"], none["totalCount"]) == ([], 0)
    # A changed externalId moves the key between filters at once.
    await assert_ok(await _patch(client, admin, ids["b"], {"externalId": "cust_a"}))
    again = await (
        await client.get(keys_url(admin) + "?externalId=cust_a", headers=admin.headers)
    ).json()
    assert {k["id"] for k in again["result"]} == {ids["a1"], ids["a2"], ids["b"]}


async def test_the_filter_is_per_organization(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    await create(client, other_admin, {"name": "t", "roles": ["developer"], "externalId": "same"})
    mine = await create(client, admin, {"name": "m", "roles": ["developer"], "externalId": "same"})
    listed = await client.get(keys_url(admin) + "?externalId=same", headers=admin.headers)
    raw = await listed.json()
    assert [k["id"] for k in raw["result"]] == [mine["key"]["id"]]
    assert raw["totalCount"] == 1


async def test_validation(client: Client, admin: Creds) -> None:
    base = {"name": "v", "roles": ["developer"]}
    url = keys_url(admin)
    cases = [
        ({"externalId": "x" * 256}, "externalId: must be 1 to 255 characters"),
        ({"externalId": ""}, "externalId: must be 1 to 255 characters"),
        ({"externalId": "a\u202eb"}, "externalId: " + HIDDEN),
        ({"externalId": "a\x00b"}, "externalId: must not contain control characters"),
        ({"externalId": 5}, "externalId: must be a string"),
        ({"meta": [1, 2]}, "meta: must be a JSON object"),
        ({"meta": "text"}, "meta: must be a JSON object"),
        ({"meta": {"x": "y" * 4090}}, "meta: must be at most 4096 bytes as JSON (4098 given)"),
    ]
    for extra, message in cases:
        response = await client.post(url, json={**base, **extra}, headers=admin.headers)
        await assert_error(response, 400, message)
    # Exactly 4 KiB as compact JSON is accepted.
    value = "y" * (4096 - len(json.dumps({"x": ""}, separators=(",", ":"))))
    made = await create(client, admin, {**base, "meta": {"x": value}})
    assert made["key"]["meta"] == {"x": value}
    response = await client.get(url + "?externalId=" + "x" * 256, headers=admin.headers)
    await assert_error(response, 400, "externalId: must be 1 to 255 characters")


async def test_changes_are_recorded_with_before_and_after(client: Client, admin: Creds) -> None:
    made = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    await assert_ok(
        await _patch(client, admin, made["id"], {"externalId": "cust_9", "meta": {"v": 1}})
    )
    await assert_ok(await _patch(client, admin, made["id"], {"meta": {"v": 2}}))
    mine = await key_updates(client, admin, made["id"])
    assert ("external-id-changed", {"externalId": None}, {"externalId": "cust_9"}) in mine
    assert ("meta-changed", {"meta": None}, {"meta": {"v": 1}}) in mine
    assert ("meta-changed", {"meta": {"v": 1}}, {"meta": {"v": 2}}) in mine
    # Upstream's list (no include) shows none of keysvc's own update types.
    plain = await assert_ok(
        await client.get(
            f"/v1/organizations/{admin.organization_id}/activities", headers=admin.headers
        )
    )
    assert not [
        r for r in plain if r.get("keyUpdateType") in ("external-id-changed", "meta-changed")
    ]


async def test_a_key_cannot_change_its_own(client: Client, admin: Creds) -> None:
    response = await _patch(client, admin, admin.id, {"externalId": "me"})
    refusal = "a key cannot change its own externalId: use another key to change it"
    await assert_error(response, 403, refusal)
