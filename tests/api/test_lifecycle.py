"""The key lifecycle: list with paging, PATCH, ETag/If-Match, DELETE, limits."""

from datetime import timedelta
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.http.app import create_app
from keysvc.http.state import HASHER
from tests.helpers import (
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
)

DEVELOPER_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
QUERY_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000003"


def keys_url(creds: Creds, key: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/keys"
    return base if key is None else f"{base}/{key}"


async def list_page(client: Client, creds: Creds, **params: Any) -> dict[str, Any]:
    response = await client.get(keys_url(creds), params=params, headers=creds.headers)
    body: dict[str, Any] = await response.json()
    await assert_ok(response)
    return body


async def test_list_pages_oldest_first(client: Client, admin: Creds) -> None:
    names = [f"k{n:02d}" for n in range(7)]
    for name in names:
        await create(client, admin, {"name": name, "roles": ["developer"]})
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = {"limit": 3} if cursor is None else {"limit": 3, "cursor": cursor}
        body = await list_page(client, admin, **params)
        assert body["totalCount"] == 8  # the admin key and seven more
        assert len(body["result"]) <= 3
        seen += [key["name"] for key in body["result"]]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == ["acme admin", *names]


async def test_list_default_limit_and_shape(client: Client, admin: Creds) -> None:
    body = await list_page(client, admin)
    assert set(body) == {"status", "requestId", "result", "nextCursor", "totalCount"}
    assert body["nextCursor"] is None and body["totalCount"] == 1
    assert body["result"][0]["id"] == admin.id
    assert "keySecret" not in body["result"][0]


async def test_list_only_own_organization(client: Client, admin: Creds, other_admin: Creds) -> None:
    body = await list_page(client, admin)
    assert [key["id"] for key in body["result"]] == [admin.id]


@pytest.mark.parametrize("limit", ["0", "-1", "251", "1000000000000", "ten", "1.5", ""])
async def test_list_bad_limit(client: Client, admin: Creds, limit: str) -> None:
    response = await client.get(keys_url(admin), params={"limit": limit}, headers=admin.headers)
    await assert_error(response, 400, "limit: must be an integer from 1 to 250")


async def test_list_unknown_or_repeated_parameter(client: Client, admin: Creds) -> None:
    response = await client.get(keys_url(admin) + "?colour=red", headers=admin.headers)
    await assert_error(response, 400, "colour: is not a known field")
    response = await client.get(keys_url(admin) + "?limit=1&limit=2", headers=admin.headers)
    await assert_error(response, 400, "limit: given more than once")


async def test_tampered_and_foreign_cursors_are_refused(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    for n in range(3):
        await create(client, admin, {"name": f"k{n}", "roles": ["developer"]})
        await create(client, other_admin, {"name": f"o{n}", "roles": ["developer"]})
    cursor = (await list_page(client, admin, limit=1))["nextCursor"]
    foreign = (await list_page(client, other_admin, limit=1))["nextCursor"]
    seq, _, mac = cursor.partition(".")
    tampered = [
        f"{int(seq) + 1}.{mac}",
        f"{seq}.{mac[:-1]}{'A' if mac[-1] != 'A' else 'B'}",
        "garbage",
        "",
        "1.",
        foreign,
        "9" * 40 + ".x",
    ]
    for bad in tampered:
        response = await client.get(keys_url(admin), params={"cursor": bad}, headers=admin.headers)
        await assert_error(
            response, 400, "cursor: not a cursor from this list; start again without it"
        )


async def cursor_places(client: Client, creds: Creds) -> list[str]:
    """The part of each of the organization's cursors a client can read, page by page."""
    places, body = [], await list_page(client, creds, limit=2)
    while body["nextCursor"] is not None:
        place, _, _ = body["nextCursor"].partition(".")
        places.append(place)
        body = await list_page(client, creds, limit=2, cursor=body["nextCursor"])
    return places


async def test_cursors_tell_nothing_of_other_organizations(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    """Org A's keys are created on either side of many of org B's; org C makes the same
    keys as A with nothing in between. A's cursors read the same as C's."""
    control = await bootstrap(client.app, "control")
    for n in range(2):
        for creds in (admin, control):
            await create(client, creds, {"name": f"early {n}", "roles": ["developer"]})
    for n in range(25):
        await create(client, other_admin, {"name": f"b{n}", "roles": ["developer"]})
    for n in range(3):
        for creds in (admin, control):
            await create(client, creds, {"name": f"late {n}", "roles": ["developer"]})
    # Five keys and the admin key: a cursor after the 2nd and the 4th.
    assert await cursor_places(client, admin) == ["2", "4"]
    assert await cursor_places(client, control) == ["2", "4"]


async def test_a_cursor_signed_for_the_global_sequence_is_refused(
    client: Client, admin: Creds
) -> None:
    """Cursors made before keys had a place in their organization carried the row
    sequence: the same number now names another place, so they are refused."""
    for n in range(3):
        await create(client, admin, {"name": f"k{n}", "roles": ["developer"]})
    hasher = client.app[HASHER]
    old = f"2.{hasher.sign('cursor', f'{admin.organization_id}:2')}"
    response = await client.get(keys_url(admin), params={"cursor": old}, headers=admin.headers)
    await assert_error(response, 400, "cursor: not a cursor from this list; start again without it")


async def test_patch_every_field(client: Client, admin: Creds) -> None:
    key = (await create(client, admin, {"name": "old", "roles": ["developer"]}))["key"]
    body = {
        "name": "new",
        "state": "disabled",
        "expireAt": "2099-01-01T01:00:00+01:00",
        "assignedRoleIds": [QUERY_ROLE],
        "ipAccessList": [{"source": "192.0.2.0/24", "description": "lab"}],
    }
    response = await client.patch(keys_url(admin, key["id"]), json=body, headers=admin.headers)
    patched = await assert_ok(response)
    assert patched["name"] == "new"
    assert patched["state"] == "disabled"
    assert patched["expireAt"] == "2099-01-01T00:00:00Z"
    assert patched["roles"] == ["query_endpoints"]
    assert [r["roleId"] for r in patched["assignedRoles"]] == [QUERY_ROLE]
    assert patched["ipAccessList"] == body["ipAccessList"]
    assert patched["createdAt"] == key["createdAt"] and patched["keySuffix"] == key["keySuffix"]
    read = await assert_ok(await client.get(keys_url(admin, key["id"]), headers=admin.headers))
    assert read == patched


async def test_patch_partial_and_clearing(client: Client, admin: Creds) -> None:
    body = {
        "name": "keep",
        "roles": ["developer"],
        "expireAt": "2099-01-01T00:00:00Z",
        "ipAccessList": [{"source": "10.0.0.0/8"}],
    }
    key = (await create(client, admin, body))["key"]
    url = keys_url(admin, key["id"])
    for clear in (None, ""):
        patched = await assert_ok(
            await client.patch(url, json={"expireAt": clear}, headers=admin.headers)
        )
        assert patched["expireAt"] is None
        assert patched["name"] == "keep" and patched["roles"] == ["developer"]
        assert patched["ipAccessList"] == [{"source": "10.0.0.0/8"}]
    patched = await assert_ok(
        await client.patch(url, json={"ipAccessList": []}, headers=admin.headers)
    )
    assert patched["ipAccessList"] == []
    unchanged = await assert_ok(await client.patch(url, json={}, headers=admin.headers))
    assert unchanged == patched


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"name": ""}, "name: must be 1 to 255 characters"),
        ({"state": "on"}, "state: must be one of: enabled, disabled"),
        ({"expireAt": "2001-01-01T00:00:00Z"}, "expireAt: must be in the future"),
        ({"roles": [], "assignedRoleIds": []},
         "roles: a key needs at least one role: give roles or assignedRoleIds"),
        ({"ipAccessList": [{"source": "10.0.0.1/8"}]},
         "ipAccessList.0.source: has host bits set; did you mean 10.0.0.0/8?"),
        ({"hashData": {}}, "hashData: is not a known field"),
        ({"keySuffix": "abcd"}, "keySuffix: is not a known field"),
    ],
)  # fmt: skip
async def test_patch_validated_like_create(
    client: Client, admin: Creds, payload: dict[str, Any], message: str
) -> None:
    key = (await create(client, admin, {"name": "k", "roles": ["developer"]}))["key"]
    response = await client.patch(keys_url(admin, key["id"]), json=payload, headers=admin.headers)
    await assert_error(response, 400, message)


async def test_patch_governs_the_very_next_request(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    target = await create_creds(client, admin, {"name": "t", "roles": ["admin"]})
    url = keys_url(admin, target.id)
    read_own = keys_url(admin, admin.id)
    await assert_ok(await client.get(read_own, headers=target.headers))

    await assert_ok(await client.patch(url, json={"state": "disabled"}, headers=admin.headers))
    await assert_error(await client.get(read_own, headers=target.headers), 401, "key is disabled")
    await assert_ok(await client.patch(url, json={"state": "enabled"}, headers=admin.headers))
    await assert_ok(await client.get(read_own, headers=target.headers))

    await assert_ok(
        await client.patch(url, json={"roles": ["query_endpoints"]}, headers=admin.headers)
    )
    response = await client.get(read_own, headers=target.headers)
    await assert_error(response, 403, "this key lacks the permission keys:read")
    await assert_ok(await client.patch(url, json={"roles": ["developer"]}, headers=admin.headers))

    only_elsewhere = {"ipAccessList": [{"source": "203.0.113.0/24"}]}
    await assert_ok(await client.patch(url, json=only_elsewhere, headers=admin.headers))
    response = await client.get(read_own, headers=target.headers)
    await assert_error(response, 403, "client address not allowed for this key")
    await assert_ok(await client.patch(url, json={"ipAccessList": []}, headers=admin.headers))

    soon = clock.now.replace(microsecond=0) + timedelta(seconds=30)
    await assert_ok(
        await client.patch(url, json={"expireAt": soon.isoformat()}, headers=admin.headers)
    )
    await assert_ok(await client.get(read_own, headers=target.headers))
    clock.advance(seconds=31)
    await assert_error(await client.get(read_own, headers=target.headers), 401, "key has expired")


async def test_etag_and_stale_if_match(client: Client, admin: Creds) -> None:
    key = (await create(client, admin, {"name": "shared", "roles": ["developer"]}))["key"]
    url = keys_url(admin, key["id"])
    first = await client.get(url, headers=admin.headers)
    await assert_ok(first)
    etag = first.headers["ETag"]
    assert etag.startswith('"') and etag.endswith('"')

    # Alice patches with the ETag she read: it matches, and a new ETag comes back.
    alice = await client.patch(
        url, json={"name": "alice"}, headers={**admin.headers, "If-Match": etag}
    )
    await assert_ok(alice)
    assert alice.headers["ETag"] != etag
    # Bob still holds the old ETag: his write must not silently overwrite Alice's.
    bob = await client.patch(url, json={"name": "bob"}, headers={**admin.headers, "If-Match": etag})
    await assert_error(
        bob, 412, "the key has changed since you read it (If-Match does not match its ETag)"
    )
    read = await assert_ok(await client.get(url, headers=admin.headers))
    assert read["name"] == "alice"
    # A list of tags and * both match; without If-Match the write is unconditional.
    current = alice.headers["ETag"]
    multi = {**admin.headers, "If-Match": f'"nope", {current}'}
    await assert_ok(await client.patch(url, json={"name": "carol"}, headers=multi))
    await assert_ok(
        await client.patch(url, json={"name": "dave"}, headers={**admin.headers, "If-Match": "*"})
    )
    await assert_ok(await client.patch(url, json={"name": "erin"}, headers=admin.headers))


async def test_etag_ignores_used_at(client: Client, admin: Creds, clock: FakeClock) -> None:
    user = await create_creds(client, admin, {"name": "u", "roles": ["developer"]})
    url = keys_url(admin, user.id)
    before = (await client.get(url, headers=admin.headers)).headers["ETag"]
    await assert_ok(await client.get(keys_url(admin, admin.id), headers=user.headers))
    after = await client.get(url, headers=admin.headers)
    assert "usedAt" in (await after.json())["result"]
    assert after.headers["ETag"] == before


async def test_delete_key(client: Client, admin: Creds) -> None:
    doomed = await create_creds(client, admin, {"name": "doomed", "roles": ["admin"]})
    url = keys_url(admin, doomed.id)
    await assert_ok(await client.get(keys_url(admin, admin.id), headers=doomed.headers))
    response = await client.delete(url, headers=admin.headers)
    assert await assert_ok(response) is None
    assert "result" not in await response.json()
    # Fails authentication on the very next request, and reads as 404.
    response = await client.get(keys_url(admin, admin.id), headers=doomed.headers)
    await assert_error(response, 401, UNAUTHORIZED)
    await assert_error(
        await client.get(url, headers=admin.headers), 404, "key not found in this organization"
    )
    await assert_error(
        await client.delete(url, headers=admin.headers), 404, "key not found in this organization"
    )
    assert (await list_page(client, admin))["totalCount"] == 1


STALE = "the key has changed since you read it (If-Match does not match its ETag)"


async def test_delete_honours_if_match(client: Client, admin: Creds) -> None:
    key = (await create(client, admin, {"name": "guarded", "roles": ["developer"]}))["key"]
    url = keys_url(admin, key["id"])
    etag = (await client.get(url, headers=admin.headers)).headers["ETag"]
    await assert_ok(await client.patch(url, json={"name": "renamed"}, headers=admin.headers))

    # Read before the rename: the delete is refused, and the key is still there.
    stale = {**admin.headers, "If-Match": etag}
    await assert_error(await client.delete(url, headers=stale), 412, STALE)
    assert (await assert_ok(await client.get(url, headers=admin.headers)))["name"] == "renamed"

    current = (await client.get(url, headers=admin.headers)).headers["ETag"]
    await assert_ok(await client.delete(url, headers={**admin.headers, "If-Match": current}))
    await assert_error(
        await client.get(url, headers=admin.headers), 404, "key not found in this organization"
    )


async def test_delete_if_match_star_needs_an_existing_key(client: Client, admin: Creds) -> None:
    key = (await create(client, admin, {"name": "any", "roles": ["developer"]}))["key"]
    url, star = keys_url(admin, key["id"]), {**admin.headers, "If-Match": "*"}
    await assert_ok(await client.delete(url, headers=star))
    await assert_error(
        await client.delete(url, headers=star), 404, "key not found in this organization"
    )


async def test_widening_a_role_moves_the_etag(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "reader", "permissions": ["keys:read"]})
    key = (await create(client, admin, {"name": "holder", "assignedRoleIds": [role["id"]]}))["key"]
    url = keys_url(admin, key["id"])
    before = (await client.get(url, headers=admin.headers)).headers["ETag"]

    role_url = f"/v1/organizations/{admin.organization_id}/roles/{role['id']}"
    widened = await client.patch(role_url, json={"permissions": ["*"]}, headers=admin.headers)
    await assert_ok(widened)
    after = (await client.get(url, headers=admin.headers)).headers["ETag"]
    assert after != before
    # A PATCH made against the narrower view is refused; the current ETag passes.
    stale = {**admin.headers, "If-Match": before}
    await assert_error(await client.patch(url, json={"name": "x"}, headers=stale), 412, STALE)
    await assert_ok(
        await client.patch(url, json={"name": "x"}, headers={**admin.headers, "If-Match": after})
    )


async def test_key_cannot_delete_itself(client: Client, admin: Creds) -> None:
    response = await client.delete(keys_url(admin, admin.id), headers=admin.headers)
    await assert_error(response, 400, "a key cannot delete itself: use another key to delete it")
    await assert_ok(await client.get(keys_url(admin, admin.id), headers=admin.headers))


async def test_developer_cannot_patch_or_delete(client: Client, admin: Creds) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    url = keys_url(admin, admin.id)
    response = await client.patch(url, json={"name": "x"}, headers=dev.headers)
    await assert_error(response, 403, "this key lacks the permission keys:update")
    response = await client.delete(url, headers=dev.headers)
    await assert_error(response, 403, "this key lacks the permission keys:delete")


async def test_developer_cannot_grant_admin(client: Client, admin: Creds) -> None:
    """Even with keys:create and keys:update, nobody grants more than they hold."""
    role = await assert_ok(
        await client.post(
            f"/v1/organizations/{admin.organization_id}/roles",
            json={
                "name": "key-manager",
                "permissions": ["keys:read", "keys:create", "keys:update"],
            },
            headers=admin.headers,
        )
    )
    manager = await create_creds(client, admin, {"name": "m", "assignedRoleIds": [role["id"]]})
    response = await client.post(
        keys_url(admin), json={"name": "x", "roles": ["admin"]}, headers=manager.headers
    )
    await assert_error(response, 403, "cannot grant role admin: this key lacks the permission *")
    response = await client.post(
        keys_url(admin), json={"name": "x", "roles": ["developer"]}, headers=manager.headers
    )
    await assert_error(
        response, 403, "cannot grant role developer: this key lacks the permission roles:read"
    )
    # What it does hold, it may grant.
    peer = await create(client, manager, {"name": "peer", "assignedRoleIds": [role["id"]]})
    response = await client.patch(
        keys_url(admin, peer["key"]["id"]), json={"roles": ["admin"]}, headers=manager.headers
    )
    await assert_error(response, 403, "cannot grant role admin: this key lacks the permission *")
    response = await client.patch(
        keys_url(admin, manager.id), json={"roles": ["admin"]}, headers=manager.headers
    )
    await assert_error(
        response, 403, "a key cannot change its own roles: use another key to change it"
    )


async def test_keys_per_organization_limit(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, max_keys_per_org=3)
    admin = await bootstrap(client.app)
    other = await bootstrap(client.app, "other")
    await create(client, admin, {"name": "two", "roles": ["developer"]})
    await create(client, admin, {"name": "three", "roles": ["developer"]})
    response = await client.post(
        keys_url(admin), json={"name": "four", "roles": ["developer"]}, headers=admin.headers
    )
    await assert_error(response, 409, "this organization has reached its limit of 3 keys")
    await create(client, other, {"name": "fine elsewhere", "roles": ["developer"]})


async def test_used_at_survives_a_restart(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await aiohttp_client(create_app(settings, clock=clock))
    admin = await bootstrap(client.app)
    reader = await create_creds(client, admin, {"name": "reader", "roles": ["developer"]})
    await assert_ok(await client.get(keys_url(admin, reader.id), headers=admin.headers))
    used = clock.now.strftime("%Y-%m-%dT%H:%M:00Z")
    await client.close()

    clock.advance(minutes=5)
    again = await aiohttp_client(create_app(settings, clock=clock))
    # Read through the other key, so this read cannot itself write the admin's usedAt.
    result = await assert_ok(await again.get(keys_url(admin, admin.id), headers=reader.headers))
    assert result["usedAt"] == used
