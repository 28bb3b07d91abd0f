"""Bounds on roles: custom roles per organization, the role list in pages read with a fixed
number of statements, permissions per role and roles per key, on every path that adds them."""

import asyncio
import uuid
from typing import Any

import pytest

from keysvc.config import build_settings
from keysvc.http.schemas import MAX_PERMISSIONS, MAX_ROLE_IDS
from keysvc.http.state import STORE
from tests.api.roles import keys_url, roles_url
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    client_with,
    count_reads,
    create,
    create_creds,
    create_role,
    settled,
)

SYSTEM_ROLES = ["admin", "developer", "query_endpoints"]
BAD_CURSOR = "cursor: not a cursor from this list; start again without it"
TOO_MANY_ROLES = (
    f"assignedRoleIds: a key holds at most {MAX_ROLE_IDS} roles, those named in roles included"
)


async def list_page(client: Client, admin: Creds, **params: str) -> dict[str, Any]:
    response = await client.get(roles_url(admin), params=params, headers=admin.headers)
    await assert_ok(response)
    page: dict[str, Any] = await response.json()
    return page


async def walk(client: Client, admin: Creds, limit: int) -> tuple[list[str], set[int]]:
    """Every role's name through the pages of ``limit``, and the totalCounts reported."""
    names: list[str] = []
    totals: set[int] = set()
    params = {"limit": str(limit)}
    while True:
        page = await list_page(client, admin, **params)
        assert len(page["result"]) <= limit
        names.extend(role["name"] for role in page["result"])
        totals.add(page["totalCount"])
        if page["nextCursor"] is None:
            return names, totals
        params = {"limit": str(limit), "cursor": page["nextCursor"]}


# Custom roles per organization.


def test_the_cap_is_a_setting() -> None:
    assert build_settings({}, {}).max_roles_per_org == 1000
    assert build_settings({}, {"KEYSVC_MAX_ROLES_PER_ORG": "7"}).max_roles_per_org == 7
    assert build_settings({"max_roles_per_org": "9"}, {}).max_roles_per_org == 9


async def test_past_the_cap_a_create_is_409_and_writes_nothing(
    aiohttp_client: ClientFactory, settings: Any, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, max_roles_per_org=3)
    admin, other = await bootstrap(client.app), await bootstrap(client.app, "other")
    for name in ("a", "b", "c"):
        await create_role(client, admin, {"name": name})
    key = await create(client, admin, {"name": "k", "roles": ["developer"]})
    body = {"name": "d", "permissions": ["reports:read"], "actors": [f"apiKey/{key['key']['id']}"]}
    response = await client.post(roles_url(admin), json=body, headers=admin.headers)
    await assert_error(
        response, 409, "this organization has reached its limit of 3 custom roles;"
        " delete one it no longer needs",
    )  # fmt: skip
    names, totals = await walk(client, admin, 250)
    assert names == [*SYSTEM_ROLES, "a", "b", "c"] and totals == {6}
    held = await assert_ok(
        await client.get(keys_url(admin, key["key"]["id"]), headers=admin.headers)
    )
    assert [role["roleName"] for role in held["assignedRoles"]] == ["developer"]
    # Another organization has its own count; a deleted role makes room.
    await create_role(client, other, {"name": "d"})
    a_role = next(r for r in (await list_page(client, admin))["result"] if r["name"] == "a")
    await assert_ok(await client.delete(roles_url(admin, a_role["id"]), headers=admin.headers))
    await create_role(client, admin, {"name": "d"})


async def test_the_cap_holds_against_concurrent_creates(
    aiohttp_client: ClientFactory, settings: Any, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, max_roles_per_org=5)
    admin = await bootstrap(client.app)
    responses = await asyncio.gather(
        *(
            client.post(roles_url(admin), json={"name": f"r{i}"}, headers=admin.headers)
            for i in range(12)
        )
    )
    assert sorted(response.status for response in responses) == [200] * 5 + [409] * 7
    names, totals = await walk(client, admin, 250)
    assert len(names) == 3 + 5 and totals == {8}


# The list in pages.

NAMES = ["zeta", "Alpha", "alpha", "b", "b b", "\u00e9t\u00e9", "\U0001f511 keys", "x" * 255,
         "\u05de\u05e4\u05ea\u05d7", "admin2", "0", "m"]  # fmt: skip


@pytest.mark.parametrize("limit", [1, 2, 5, 250])
async def test_pages_walk_every_role_exactly_once(client: Client, admin: Creds, limit: int) -> None:
    for name in NAMES:
        await create_role(client, admin, {"name": name})
    names, totals = await walk(client, admin, limit)
    # System roles first, then custom roles by name (code point order), each once.
    assert names == [*SYSTEM_ROLES, *sorted(NAMES)]
    assert totals == {len(SYSTEM_ROLES) + len(NAMES)}


async def test_a_list_without_parameters_is_the_first_page(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "r", "permissions": ["reports:read"]})
    page = await list_page(client, admin)
    assert set(page) == {"status", "requestId", "result", "nextCursor", "totalCount"}
    assert [r["name"] for r in page["result"]] == [*SYSTEM_ROLES, "r"]
    assert page["result"][-1] == role
    assert page["nextCursor"] is None and page["totalCount"] == 4


async def test_a_role_added_or_removed_between_pages(client: Client, admin: Creds) -> None:
    for name in ("b", "d", "f"):
        await create_role(client, admin, {"name": name})
    first = await list_page(client, admin, limit="4")
    assert [r["name"] for r in first["result"]] == [*SYSTEM_ROLES, "b"]
    await create_role(client, admin, {"name": "a"})  # before the cursor: not seen
    await create_role(client, admin, {"name": "e"})  # after it: seen
    gone = next(r for r in (await list_page(client, admin))["result"] if r["name"] == "b")
    await assert_ok(await client.delete(roles_url(admin, gone["id"]), headers=admin.headers))
    rest = await list_page(client, admin, limit="4", cursor=first["nextCursor"])
    assert [r["name"] for r in rest["result"]] == ["d", "e", "f"]
    assert rest["nextCursor"] is None and rest["totalCount"] == 3 + 4


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"limit": "0"}, "limit: must be an integer from 1 to 250"),
        ({"limit": "251"}, "limit: must be an integer from 1 to 250"),
        ({"limit": "x"}, "limit: must be an integer from 1 to 250"),
        ({"cursor": "bogus"}, BAD_CURSOR),
        ({"cursor": "YWRtaW4.AAAAAAAAAAAAAAAAAAAAAA"}, BAD_CURSOR),
        ({"cursor": "a" * 2000 + ".x"}, BAD_CURSOR),
    ],
)
async def test_bad_paging_parameters(
    client: Client, admin: Creds, params: dict[str, str], message: str
) -> None:
    response = await client.get(roles_url(admin), params=params, headers=admin.headers)
    await assert_error(response, 400, message)


async def test_a_cursor_is_good_only_for_its_organization(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    await create_role(client, admin, {"name": "r"})
    cursor = (await list_page(client, admin, limit="1"))["nextCursor"]
    response = await client.get(
        roles_url(other_admin), params={"cursor": cursor}, headers=other_admin.headers
    )
    await assert_error(response, 400, BAD_CURSOR)


async def test_a_page_is_read_in_a_fixed_number_of_statements(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    for index in range(30):
        role = await create_role(client, admin, {"name": f"r{index:02}"})
        await create(client, admin, {"name": f"k{index}", "assignedRoleIds": [role["id"]]})
    await settled(client.app)
    # Until the caller's credential stays cached: on PostgreSQL it was dropped once
    # within about 2 s of the first page (a change the writes before it announced,
    # heard after ``settled``), and the first page counted its credential's read too.
    for _ in range(100):
        credential = count_reads(client.app[STORE], monkeypatch)
        await list_page(client, admin, limit="1")
        monkeypatch.undo()
        if len(credential) == 3:
            break
        await asyncio.sleep(0.05)
    counts, read = {}, {}
    for limit in (1, 5, 33):
        statements = count_reads(client.app[STORE], monkeypatch)
        page = await list_page(client, admin, limit=str(limit))
        assert len(page["result"]) == limit
        assert all(len(role["actors"]) == 1 for role in page["result"][3:])
        counts[limit], read[limit] = len(statements), list(statements)
        monkeypatch.undo()
    # The page, the keys holding its roles, and the count: whatever the page size.
    assert counts == {1: 3, 5: 3, 33: 3}, read


# Permissions per role.


def _permissions(count: int, start: int = 0) -> list[str]:
    return [f"p{index}:read" for index in range(start, start + count)]


def _policy(permissions: list[str]) -> dict[str, Any]:
    return {"allowDeny": "ALLOW", "permissions": permissions, "resources": ["*"]}


def _too_many(sent: int) -> str:
    return (
        f"permissions: a role grants at most {MAX_PERMISSIONS} permissions, its policies'"
        f" included; this body has {sent}"
    )


PERMISSION_BODIES = {
    "policies": ({"policies": [_policy(_permissions(100, i * 100)) for i in range(40)]}, 4000),
    "both": ({"permissions": _permissions(60), "policies": [_policy(_permissions(60, 60))]}, 120),
    "repeated": ({"permissions": _permissions(60), "policies": [_policy(_permissions(60))]}, 120),
}


@pytest.mark.parametrize("case", PERMISSION_BODIES)
async def test_a_role_grants_at_most_max_permissions_in_all(
    client: Client, admin: Creds, case: str
) -> None:
    body, sent = PERMISSION_BODIES[case]
    response = await client.post(
        roles_url(admin), json={"name": "r", **body}, headers=admin.headers
    )
    await assert_error(response, 400, _too_many(sent))
    role = await create_role(client, admin, {"name": "r", "permissions": ["reports:read"]})
    response = await client.patch(roles_url(admin, role["id"]), json=body, headers=admin.headers)
    await assert_error(response, 400, _too_many(sent))
    assert (
        await assert_ok(await client.get(roles_url(admin, role["id"]), headers=admin.headers))
        == role
    )
    names, _ = await walk(client, admin, 250)
    assert names == [*SYSTEM_ROLES, "r"]


async def test_max_permissions_across_permissions_and_policies_are_taken(
    client: Client, admin: Creds
) -> None:
    body = {
        "name": "r",
        "permissions": _permissions(50),
        "policies": [_policy(_permissions(50, 50))],
    }
    role = await create_role(client, admin, body)
    assert len(role["permissions"]) == MAX_PERMISSIONS


# Roles per key.


async def _custom_roles(client: Client, admin: Creds, count: int) -> list[str]:
    return [(await create_role(client, admin, {"name": f"r{i:03}"}))["id"] for i in range(count)]


async def test_a_key_is_created_or_patched_with_at_most_max_roles(
    client: Client, admin: Creds
) -> None:
    role_ids = await _custom_roles(client, admin, MAX_ROLE_IDS)
    too_many = {"name": "k", "assignedRoleIds": role_ids, "roles": ["developer"]}
    response = await client.post(keys_url(admin), json=too_many, headers=admin.headers)
    await assert_error(response, 400, TOO_MANY_ROLES)
    key = await create(client, admin, {"name": "k", "roles": ["developer"]})
    url = keys_url(admin, key["key"]["id"])
    response = await client.patch(
        url, json={"assignedRoleIds": role_ids, "roles": ["developer"]}, headers=admin.headers
    )
    await assert_error(response, 400, TOO_MANY_ROLES)
    read = await assert_ok(await client.get(url, headers=admin.headers))
    assert [role["roleName"] for role in read["assignedRoles"]] == ["developer"]
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    assert len(listed) == 2
    # Exactly the most is taken, either way.
    full = await create(client, admin, {"name": "full", "assignedRoleIds": role_ids})
    assert len(full["key"]["assignedRoles"]) == MAX_ROLE_IDS
    patched = await client.patch(url, json={"assignedRoleIds": role_ids}, headers=admin.headers)
    assert len((await assert_ok(patched))["assignedRoles"]) == MAX_ROLE_IDS


async def test_actors_cannot_give_a_key_more_than_max_roles(client: Client, admin: Creds) -> None:
    role_ids = await _custom_roles(client, admin, MAX_ROLE_IDS)
    full = await create_creds(client, admin, {"name": "full", "assignedRoleIds": role_ids})
    almost = await create_creds(client, admin, {"name": "almost", "assignedRoleIds": role_ids[1:]})
    message = (
        f"actors: key {full.id} already holds {MAX_ROLE_IDS} roles, the most a key may hold;"
        " take one from it first"
    )
    actors = [f"apiKey/{almost.id}", f"apiKey/{full.id}"]
    # Through a new role: refused, and no role is made.
    response = await client.post(
        roles_url(admin), json={"name": "one more", "actors": actors}, headers=admin.headers
    )
    await assert_error(response, 409, message)
    names, totals = await walk(client, admin, 250)
    assert "one more" not in names and totals == {3 + MAX_ROLE_IDS}
    # Through an existing role's actors: refused, and its actors unchanged.
    spare = await create_role(client, admin, {"name": "spare"})
    response = await client.patch(
        roles_url(admin, spare["id"]), json={"actors": actors}, headers=admin.headers
    )
    await assert_error(response, 409, message)
    read = await assert_ok(await client.get(roles_url(admin, spare["id"]), headers=admin.headers))
    assert read["actors"] == []
    # A key one short of the most may take one more; a full key may keep the roles it has.
    response = await client.patch(
        roles_url(admin, spare["id"]), json={"actors": actors[:1]}, headers=admin.headers
    )
    assert (await assert_ok(response))["actors"] == actors[:1]
    response = await client.patch(
        roles_url(admin, role_ids[0]), json={"actors": [actors[1]]}, headers=admin.headers
    )
    assert (await assert_ok(response))["actors"] == [actors[1]]
    for creds in (full, almost):
        key = await assert_ok(await client.get(keys_url(admin, creds.id), headers=admin.headers))
        assert len(key["assignedRoles"]) == MAX_ROLE_IDS


async def test_an_unknown_role_id_is_still_named(client: Client, admin: Creds) -> None:
    """An unknown role UUID is still a 400 naming it, before any count."""
    missing = str(uuid.uuid4())
    response = await client.post(
        keys_url(admin), json={"name": "k", "assignedRoleIds": [missing]}, headers=admin.headers
    )
    await assert_error(response, 400, f"assignedRoleIds: no role {missing} in this organization")
