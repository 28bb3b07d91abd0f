"""JSON nested deep, in every body keysvc reads and in a key's meta: a clear 400 at
any depth, never a 500 from RecursionError (keysvc.nesting). A meta nests at most
MAX_META_DEPTH levels; one stored deeper before that bound is read as none, so its
key still reads, lists, is disabled and takes a new meta."""

import json
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.nesting import MAX_BODY_DEPTH, MAX_META_DEPTH
from tests.handsql import hand_sql
from tests.helpers import (
    Client,
    Creds,
    assert_error,
    assert_ok,
    assert_request_id,
    basic,
    create,
    create_creds,
    create_role,
    get_key,
    keys_url,
)

TOO_DEEP = "body: JSON is nested too deeply"
SOME_UUID = "00000000-0000-4000-8000-000000000000"
# Around the bounds, around where Python's own recursion limit used to bite (a body
# that parses, then fails), and far past it.
DEPTHS = [MAX_META_DEPTH + 1, MAX_BODY_DEPTH + 1, 930, 940, 960, 990, 1000, 10_000]


def arrays(depth: int) -> str:
    """JSON text: ``depth`` arrays, one inside the other."""
    return "[" * depth + "]" * depth


def objects(depth: int) -> str:
    """JSON text: ``depth`` objects, one inside the other."""
    return '{"a":' * (depth - 1) + "{}" + "}" * (depth - 1)


def meta_of(depth: int) -> str:
    """A meta object ``depth`` levels deep, itself included (arrays inside)."""
    return '{"a":' + arrays(depth - 1) + "}"


# (method, path under the organization, or from /v1/)
BODIES = {
    "create-key": ("POST", "/keys"),
    "patch-key": ("PATCH", "/keys/{key}"),
    "rotate-key": ("POST", "/keys/{key}/rotate"),
    "key-credits": ("POST", "/keys/{key}/credits"),
    "create-role": ("POST", "/roles"),
    "patch-role": ("PATCH", "/roles/{role}"),
    "create-webhook": ("POST", "/webhooks"),
    "patch-webhook": ("PATCH", f"/webhooks/{SOME_UUID}"),
    "rotate-webhook-secret": ("POST", f"/webhooks/{SOME_UUID}/rotate-secret"),
    "revoke-leaked": ("POST", "/v1/keys/revoke-leaked"),
}
# Where the deep value sits: the whole body, a known field, an unknown one, meta.
PLACES = {
    "body-arrays": lambda depth: arrays(depth),
    "body-objects": lambda depth: objects(depth),
    "name": lambda depth: '{"name": ' + arrays(depth - 1) + "}",
    "unknown-field": lambda depth: '{"x": ' + objects(depth - 1) + "}",
    "meta": lambda depth: '{"name": "k", "roles": ["developer"], "meta": ' + meta_of(depth) + "}",
}


async def _send(client: Client, admin: Creds, ids: dict[str, str], endpoint: str, text: str) -> Any:
    method, path = BODIES[endpoint]
    if not path.startswith("/v1/"):
        path = f"/v1/organizations/{admin.organization_id}" + path.format(**ids)
    headers = {**admin.headers, "Content-Type": "application/json"}
    return await client.request(method, path, data=text.encode(), headers=headers)


@pytest.mark.sqlite_only
@pytest.mark.parametrize("endpoint", BODIES)
@pytest.mark.parametrize("place", PLACES)
async def test_a_deep_body_is_a_400_at_any_depth(
    client: Client, admin: Creds, endpoint: str, place: str
) -> None:
    """Never a 500: a 400 envelope, whichever body, wherever the depth is, however deep."""
    key = (await create(client, admin, {"name": "target", "roles": ["developer"]}))["key"]
    role = await create_role(client, admin, {"name": "target", "permissions": ["a:b"]})
    ids = {"key": key["id"], "role": role["id"]}
    for depth in DEPTHS:
        response = await _send(client, admin, ids, endpoint, PLACES[place](depth))
        body = await response.json()
        assert response.status == 400, (depth, body)
        assert set(body) == {"status", "error", "requestId"}
        assert_request_id(body, response)
        if depth > MAX_BODY_DEPTH:
            assert body["error"] == TOO_DEEP, (depth, body)


async def test_meta_nests_at_most_its_bound_and_says_so(client: Client, admin: Creds) -> None:
    text = '{"name": "k", "roles": ["developer"], "meta": ' + meta_of(MAX_META_DEPTH) + "}"
    response = await client.post(
        keys_url(admin), data=text, headers={**admin.headers, "Content-Type": "application/json"}
    )
    key = (await assert_ok(response))["key"]
    assert key["meta"] == json.loads(meta_of(MAX_META_DEPTH))
    too_deep = (
        f"meta: must nest at most {MAX_META_DEPTH} levels of objects and arrays, itself"
        f" included ({MAX_META_DEPTH + 1} given)"
    )
    for deeper in (json.loads(meta_of(MAX_META_DEPTH + 1)), json.loads(objects(40))):
        given = too_deep.replace(f"({MAX_META_DEPTH + 1} given)", f"({_depth(deeper)} given)")
        body = {"name": "k", "roles": ["developer"], "meta": deeper}
        await assert_error(
            await client.post(keys_url(admin), json=body, headers=admin.headers), 400, given
        )
        await assert_error(
            await client.patch(
                keys_url(admin, key["id"]), json={"meta": deeper}, headers=admin.headers
            ),
            400,
            given,
        )
    assert (await get_key(client, admin, key["id"]))["meta"] == key["meta"]


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@pytest.mark.parametrize("depth", [MAX_META_DEPTH + 1, 960, 2000])
async def test_a_key_whose_stored_meta_is_deeper_still_reads_and_can_be_disabled(
    client: Client, admin: Creds, settings: Settings, depth: int
) -> None:
    """A meta stored before the bound, as deep as its 4 KiB allowed: read as none."""
    user = await create_creds(
        client, admin, {"name": "deep", "roles": ["developer"], "meta": {"a": 1}}
    )
    hand_sql(settings, "update key_details set meta = ? where key_id = ?", meta_of(depth), user.id)
    got = await get_key(client, admin, user.id)
    assert "meta" not in got and got["name"] == "deep"
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    assert "meta" not in next(k for k in listed if k["id"] == user.id)
    response = await client.get("/v1/verify", headers=basic(user.key_id, user.secret))
    assert response.status == 200
    disabled = await assert_ok(
        await client.patch(
            keys_url(admin, user.id), json={"state": "disabled"}, headers=admin.headers
        )
    )
    assert disabled["state"] == "disabled"
    response = await client.get("/v1/verify", headers=basic(user.key_id, user.secret))
    assert response.status == 401
    renewed = await assert_ok(
        await client.patch(
            keys_url(admin, user.id), json={"meta": {"b": [1]}}, headers=admin.headers
        )
    )
    assert renewed["meta"] == {"b": [1]}
    deleted = await client.delete(keys_url(admin, user.id), headers=admin.headers)
    assert deleted.status == 200
