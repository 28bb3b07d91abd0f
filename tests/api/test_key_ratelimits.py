"""Issue 36: a key's named rate limits (``ratelimits``), through the real app on both
backends: set on create, replaced and cleared by PATCH, read back by GET and the list,
covered by the ETag, recorded as an activity, and the validation of the field."""

from typing import Any

import pytest

from tests.api.activities import key_updates
from tests.helpers import Client, Creds, assert_error, assert_ok, create, get_key, keys_url

TOKENS = {"name": "tokens", "limit": 100000, "windowSeconds": 60, "autoApply": False}
BURST = {"name": "burst", "limit": 10, "windowSeconds": 1, "autoApply": True}


async def _patch(
    client: Client, admin: Creds, key_id: str, body: dict[str, Any], **headers: str
) -> Any:
    return await client.patch(
        keys_url(admin, key_id), json=body, headers={**admin.headers, **headers}
    )


async def test_ratelimits_round_trip(client: Client, admin: Creds) -> None:
    body = {"name": "ai", "roles": ["developer"], "ratelimits": [TOKENS, BURST]}
    made = (await create(client, admin, body))["key"]
    assert made["ratelimits"] == [TOKENS, BURST]
    assert (await get_key(client, admin, made["id"]))["ratelimits"] == [TOKENS, BURST]
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    assert [k["ratelimits"] for k in listed if k["id"] == made["id"]] == [[TOKENS, BURST]]


async def test_auto_apply_defaults_to_false(client: Client, admin: Creds) -> None:
    entry = {"name": "day", "limit": 5, "windowSeconds": 86400}
    body = {"name": "k", "roles": ["developer"], "ratelimits": [entry]}
    made = (await create(client, admin, body))["key"]
    assert made["ratelimits"] == [{**entry, "autoApply": False}]


async def test_keys_without_them_show_none(client: Client, admin: Creds) -> None:
    made = (await create(client, admin, {"name": "plain", "roles": ["developer"]}))["key"]
    assert "ratelimits" not in await get_key(client, admin, made["id"])


async def test_patch_replaces_keeps_and_clears_them(client: Client, admin: Creds) -> None:
    body = {"name": "k", "roles": ["developer"], "ratelimits": [TOKENS]}
    made = (await create(client, admin, body))["key"]
    replaced = await assert_ok(await _patch(client, admin, made["id"], {"ratelimits": [BURST]}))
    assert replaced["ratelimits"] == [BURST]
    renamed = await assert_ok(await _patch(client, admin, made["id"], {"name": "k2"}))
    assert renamed["ratelimits"] == [BURST]
    cleared = await assert_ok(await _patch(client, admin, made["id"], {"ratelimits": None}))
    assert "ratelimits" not in cleared
    again = await assert_ok(await _patch(client, admin, made["id"], {"ratelimits": [TOKENS]}))
    emptied = await assert_ok(await _patch(client, admin, again["id"], {"ratelimits": []}))
    assert "ratelimits" not in emptied
    assert "ratelimits" not in await get_key(client, admin, made["id"])


async def test_they_live_beside_credits_and_meta(client: Client, admin: Creds) -> None:
    body = {
        "name": "k",
        "roles": ["developer"],
        "credits": {"remaining": 5},
        "meta": {"a": 1},
        "ratelimits": [TOKENS],
    }
    made = (await create(client, admin, body))["key"]
    changed = await client.post(
        keys_url(admin, made["id"]) + "/credits", json={"increment": 2}, headers=admin.headers
    )
    await assert_ok(changed)
    got = await get_key(client, admin, made["id"])
    assert (got["ratelimits"], got["credits"]["remaining"], got["meta"]) == ([TOKENS], 7, {"a": 1})


async def test_the_etag_covers_them(client: Client, admin: Creds) -> None:
    made = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    read = await client.get(keys_url(admin, made["id"]), headers=admin.headers)
    etag = read.headers["ETag"]
    await assert_ok(await _patch(client, admin, made["id"], {"ratelimits": [TOKENS]}))
    stale = await _patch(client, admin, made["id"], {"name": "x"}, **{"If-Match": etag})
    assert stale.status == 412
    fresh = await client.get(keys_url(admin, made["id"]), headers=admin.headers)
    assert fresh.headers["ETag"] != etag


async def test_a_change_is_recorded(client: Client, admin: Creds) -> None:
    made = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    await assert_ok(await _patch(client, admin, made["id"], {"ratelimits": [TOKENS]}))
    mine = await key_updates(client, admin, made["id"])
    assert mine == [("ratelimits-changed", {"ratelimits": None}, {"ratelimits": [TOKENS]})]


async def test_a_key_cannot_change_its_own(client: Client, admin: Creds) -> None:
    response = await _patch(client, admin, admin.id, {"ratelimits": None})
    refusal = "a key cannot change its own ratelimits: use another key to change it"
    await assert_error(response, 403, refusal)


def _many(count: int) -> list[dict[str, Any]]:
    return [{"name": f"n{i}", "limit": 1, "windowSeconds": 1} for i in range(count)]


@pytest.mark.parametrize(
    ("ratelimits", "message"),
    [
        (_many(17), "ratelimits: must have at most 16 entries"),
        ([TOKENS, TOKENS], "ratelimits: names must be unique"),
        (
            [{**TOKENS, "name": "Tokens"}],
            "ratelimits.0.name: must be 1 to 64 of a-z, 0-9, _, . and -",
        ),
        (
            [{**TOKENS, "name": "x" * 65}],
            "ratelimits.0.name: must be 1 to 64 of a-z, 0-9, _, . and -",
        ),
        ([{**TOKENS, "limit": 0}], "ratelimits.0.limit: must be an integer from 1 to 1000000000"),
        (
            [{**TOKENS, "windowSeconds": 86400 * 32}],
            "ratelimits.0.windowSeconds: must be an integer from 1 to 2678400",
        ),
        ([{"name": "a", "limit": 1}], "ratelimits.0.windowSeconds: is required"),
        ([{**TOKENS, "cost": 1}], "ratelimits.0.cost: is not a known field"),
        ({"name": "a"}, "ratelimits: must be an array"),
    ],
)
async def test_bad_ratelimits_are_400s(
    client: Client, admin: Creds, ratelimits: Any, message: str
) -> None:
    body = {"name": "k", "roles": ["developer"], "ratelimits": ratelimits}
    response = await client.post(keys_url(admin), json=body, headers=admin.headers)
    await assert_error(response, 400, message)
    made = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    await assert_error(
        await _patch(client, admin, made["id"], {"ratelimits": ratelimits}), 400, message
    )


async def test_the_openapi_document_states_them(client: Client) -> None:
    document = await (await client.get("/v1/openapi.json")).json()
    schemas = document["components"]["schemas"]
    for name in ("ApiKeyPostRequest", "ApiKeyPatchRequest"):
        field = schemas[name]["properties"]["ratelimits"]
        assert field["x-keysvc-addition"] is True
        assert field["maxItems"] == 16
    shown = schemas["ApiKey"]["properties"]["ratelimits"]
    assert shown["x-keysvc-addition"] is True
    assert set(shown["items"]["properties"]) == {"name", "limit", "windowSeconds", "autoApply"}
    verify = document["paths"]["/v1/verify"]
    operation = next(
        iter(op for op in verify.values() if isinstance(op, dict) and "parameters" in op)
    )
    named = {(p["in"], p["name"]) for p in operation["parameters"]}
    assert {("header", "X-Ratelimit"), ("query", "ratelimit")} <= named
