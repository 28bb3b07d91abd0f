"""Organization isolation: no endpoint lets one organization see or touch another's data."""

from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers import Client, Creds, assert_error, assert_ok, create_creds

ADMIN_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001"
DEVELOPER_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
QUERY_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000003"
WRONG_ORG = "this key does not belong to the organization in the path"
KEY_NOT_FOUND = "key not found in this organization"
ROLE_NOT_FOUND = "role not found in this organization"


@dataclass(frozen=True)
class Org:
    """An organization's admin, a spare key and an unassigned custom role in it."""

    admin: Creds
    key: str
    role: str


@dataclass(frozen=True)
class World:
    a: Org
    b: Org


async def populate(client: Client, admin: Creds, tag: str) -> Org:
    key = await create_creds(client, admin, {"name": f"{tag} spare", "roles": ["developer"]})
    response = await client.post(
        f"/v1/organizations/{admin.organization_id}/roles",
        json={"name": f"{tag} role", "permissions": ["keys:read"]},
        headers=admin.headers,
    )
    role = await assert_ok(response)
    return Org(admin, key.id, role["id"])


@pytest.fixture
async def world(client: Client, admin: Creds, other_admin: Creds) -> World:
    return World(await populate(client, admin, "a"), await populate(client, other_admin, "b"))


def url(org: str, kind: str, item: str | None = None) -> str:
    base = f"/v1/organizations/{org}/{kind}"
    return base if item is None else f"{base}/{item}"


async def snapshot(client: Client, org: Org) -> tuple[Any, Any]:
    """Everything an organization holds, as its own admin sees it."""
    headers = org.admin.headers
    keys = await assert_ok(
        await client.get(url(org.admin.organization_id, "keys"), headers=headers)
    )
    roles = await assert_ok(
        await client.get(url(org.admin.organization_id, "roles"), headers=headers)
    )
    return keys, roles


# (method, collection, "key"/"role"/None for the item in the path, a valid body)
ENDPOINTS: list[tuple[str, str, str | None, dict[str, Any] | None]] = [
    ("GET", "keys", None, None),
    ("POST", "keys", None, {"name": "new key", "roles": ["developer"]}),
    ("GET", "keys", "key", None),
    ("PATCH", "keys", "key", {"name": "renamed", "state": "disabled"}),
    ("DELETE", "keys", "key", None),
    ("GET", "roles", None, None),
    ("POST", "roles", None, {"name": "new role", "permissions": ["keys:read"]}),
    ("GET", "roles", "role", None),
    ("PATCH", "roles", "role", {"name": "renamed", "permissions": ["keys:create"]}),
    ("DELETE", "roles", "role", None),
]
ENDPOINT_IDS = [
    f"{method} {kind}{'/' + item if item else ''}" for method, kind, item, _ in ENDPOINTS
]


def item_of(org: Org, item: str | None) -> str | None:
    return {"key": org.key, "role": org.role, None: None}[item]


@pytest.mark.parametrize(("method", "kind", "item", "body"), ENDPOINTS, ids=ENDPOINT_IDS)
async def test_other_organizations_key_is_forbidden(
    client: Client,
    world: World,
    method: str,
    kind: str,
    item: str | None,
    body: dict[str, Any] | None,
) -> None:
    target = url(world.a.admin.organization_id, kind, item_of(world.a, item))
    before = await snapshot(client, world.a)
    response = await client.request(method, target, json=body, headers=world.b.admin.headers)
    await assert_error(response, 403, WRONG_ORG)
    assert await snapshot(client, world.a) == before
    # The very same request is fine from the organization's own admin: only isolation said no.
    await assert_ok(await client.request(method, target, json=body, headers=world.a.admin.headers))


@pytest.mark.parametrize(("method", "kind", "item", "body"), ENDPOINTS, ids=ENDPOINT_IDS)
async def test_unknown_organization_is_forbidden(
    client: Client,
    world: World,
    method: str,
    kind: str,
    item: str | None,
    body: dict[str, Any] | None,
) -> None:
    target = url("00000000-0000-4000-8000-000000000000", kind, item_of(world.a, item))
    response = await client.request(method, target, json=body, headers=world.a.admin.headers)
    await assert_error(response, 403, WRONG_ORG)


ITEM_ENDPOINTS: list[tuple[str, str, dict[str, Any] | None, str]] = [
    ("GET", "keys", None, KEY_NOT_FOUND),
    ("PATCH", "keys", {"name": "renamed"}, KEY_NOT_FOUND),
    ("PATCH", "keys", {"state": "disabled", "expireAt": "2099-01-01T00:00:00Z"}, KEY_NOT_FOUND),
    ("PATCH", "keys", {"roles": ["admin"]}, KEY_NOT_FOUND),
    ("PATCH", "keys", {"ipAccessList": [{"source": "192.0.2.1"}]}, KEY_NOT_FOUND),
    ("DELETE", "keys", None, KEY_NOT_FOUND),
    ("GET", "roles", None, ROLE_NOT_FOUND),
    ("PATCH", "roles", {"name": "renamed"}, ROLE_NOT_FOUND),
    ("PATCH", "roles", {"permissions": ["*"]}, ROLE_NOT_FOUND),
    ("PATCH", "roles", {"policies": [{"allowDeny": "ALLOW", "permissions": ["*"],
                                     "resources": ["*"]}]}, ROLE_NOT_FOUND),
    ("PATCH", "roles", {"actors": []}, ROLE_NOT_FOUND),
    ("DELETE", "roles", None, ROLE_NOT_FOUND),
]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "kind", "body", "message"),
    ITEM_ENDPOINTS,
    ids=[f"{m} {k} {b}" for m, k, b, _ in ITEM_ENDPOINTS],
)
async def test_other_organizations_object_is_not_found(
    client: Client,
    world: World,
    method: str,
    kind: str,
    body: dict[str, Any] | None,
    message: str,
) -> None:
    foreign = world.b.key if kind == "keys" else world.b.role
    own_url = url(world.b.admin.organization_id, kind, foreign)
    before = await assert_ok(await client.get(own_url, headers=world.b.admin.headers))
    before_a = await snapshot(client, world.a)

    response = await client.request(
        method,
        url(world.a.admin.organization_id, kind, foreign),
        json=body,
        headers=world.a.admin.headers,
    )
    await assert_error(response, 404, message)

    assert await assert_ok(await client.get(own_url, headers=world.b.admin.headers)) == before
    assert await snapshot(client, world.a) == before_a
    # The same body is valid: in its own organization the request succeeds.
    await assert_ok(await client.request(method, own_url, json=body, headers=world.b.admin.headers))


async def test_patch_key_with_own_role_on_foreign_key(client: Client, world: World) -> None:
    """The role check passes in A, so only the key lookup can stop this: B's key keeps its roles."""
    b_url = url(world.b.admin.organization_id, "keys", world.b.key)
    before = await assert_ok(await client.get(b_url, headers=world.b.admin.headers))
    response = await client.patch(
        url(world.a.admin.organization_id, "keys", world.b.key),
        json={"assignedRoleIds": [world.a.role]},
        headers=world.a.admin.headers,
    )
    await assert_error(response, 404, KEY_NOT_FOUND)
    assert await assert_ok(await client.get(b_url, headers=world.b.admin.headers)) == before
    role = await assert_ok(
        await client.get(
            url(world.a.admin.organization_id, "roles", world.a.role),
            headers=world.a.admin.headers,
        )
    )
    assert role["actors"] == []


async def test_lists_show_only_own_organization(client: Client, world: World) -> None:
    for own, other in ((world.a, world.b), (world.b, world.a)):
        org = own.admin.organization_id
        response = await client.get(url(org, "keys"), headers=own.admin.headers)
        body = await response.json()
        assert [k["id"] for k in await assert_ok(response)] == [own.admin.id, own.key]
        assert body["totalCount"] == 2
        roles = await assert_ok(await client.get(url(org, "roles"), headers=own.admin.headers))
        assert [r["id"] for r in roles] == [ADMIN_ROLE, DEVELOPER_ROLE, QUERY_ROLE, own.role]
        assert other.role not in {r["id"] for r in roles}
        for role in roles:
            assert role["tenantId"] == f"organization/{org}"
        # A system role lists only this organization's keys as its actors.
        assert roles[0]["actors"] == [f"apiKey/{own.admin.id}"]
        assert roles[1]["actors"] == [f"apiKey/{own.key}"]


async def test_system_role_read_shows_only_own_actors(client: Client, world: World) -> None:
    for own in (world.a, world.b):
        org = own.admin.organization_id
        role = await assert_ok(
            await client.get(url(org, "roles", ADMIN_ROLE), headers=own.admin.headers)
        )
        assert role["actors"] == [f"apiKey/{own.admin.id}"]
        assert role["tenantId"] == f"organization/{org}"


async def test_foreign_role_cannot_be_assigned(client: Client, world: World) -> None:
    org = world.a.admin.organization_id
    message = f"assignedRoleIds: no role {world.b.role} in this organization"
    response = await client.post(
        url(org, "keys"),
        json={"name": "x", "assignedRoleIds": [world.b.role]},
        headers=world.a.admin.headers,
    )
    await assert_error(response, 400, message)
    response = await client.patch(
        url(org, "keys", world.a.key),
        json={"assignedRoleIds": [world.b.role]},
        headers=world.a.admin.headers,
    )
    await assert_error(response, 400, message)
    key = await assert_ok(
        await client.get(url(org, "keys", world.a.key), headers=world.a.admin.headers)
    )
    assert [r["roleId"] for r in key["assignedRoles"]] == [DEVELOPER_ROLE]
    b_role = await assert_ok(
        await client.get(
            url(world.b.admin.organization_id, "roles", world.b.role),
            headers=world.b.admin.headers,
        )
    )
    assert b_role["actors"] == []


@pytest.mark.parametrize("method", ["POST", "PATCH"])
async def test_foreign_key_cannot_be_an_actor(client: Client, world: World, method: str) -> None:
    org = world.a.admin.organization_id
    target = url(org, "roles") if method == "POST" else url(org, "roles", world.a.role)
    body: dict[str, Any] = {"actors": [f"apiKey/{world.b.key}"]}
    if method == "POST":
        body["name"] = "grab"
    response = await client.request(method, target, json=body, headers=world.a.admin.headers)
    await assert_error(response, 400, f"actors: no key {world.b.key} in this organization")
    b_key = await assert_ok(
        await client.get(
            url(world.b.admin.organization_id, "keys", world.b.key),
            headers=world.b.admin.headers,
        )
    )
    assert [r["roleId"] for r in b_key["assignedRoles"]] == [DEVELOPER_ROLE]


# Who am I


@pytest.mark.parametrize(
    ("body", "roles", "permissions"),
    [
        (None, [(ADMIN_ROLE, "admin", "system")], ["*"]),
        (
            {"roles": ["developer"]},
            [(DEVELOPER_ROLE, "developer", "system")],
            ["keys:read", "roles:read"],
        ),
        (
            {"roles": ["query_endpoints"]},
            [(QUERY_ROLE, "query_endpoints", "system")],
            ["endpoints:query"],
        ),
        (
            {"roles": ["developer", "query_endpoints"]},
            [(DEVELOPER_ROLE, "developer", "system"), (QUERY_ROLE, "query_endpoints", "system")],
            ["endpoints:query", "keys:read", "roles:read"],
        ),
        (
            {"roles": ["developer"], "assignedRoleIds": ["<custom>"]},
            [(DEVELOPER_ROLE, "developer", "system"), ("<custom>", "a role", "custom")],
            ["keys:read", "roles:read"],
        ),
    ],
)
async def test_whoami(
    client: Client,
    world: World,
    body: dict[str, Any] | None,
    roles: list[tuple[str, str, str]],
    permissions: list[str],
) -> None:
    def fill(value: str) -> str:
        return world.a.role if value == "<custom>" else value

    if body is None:
        caller, name = world.a.admin, "acme admin"
    else:
        body = {**body, "assignedRoleIds": [fill(r) for r in body.get("assignedRoleIds", [])]}
        caller = await create_creds(client, world.a.admin, {"name": "me", **body})
        name = "me"
    me = await assert_ok(await client.get("/v1/whoami", headers=caller.headers))
    assert me == {
        "id": caller.id,
        "name": name,
        "organizationId": world.a.admin.organization_id,
        "assignedRoles": [
            {"roleId": fill(role_id), "roleName": role_name, "roleType": role_type}
            for role_id, role_name, role_type in roles
        ],
        "permissions": permissions,
    }


async def test_whoami_sorts_custom_permissions(client: Client, world: World) -> None:
    response = await client.post(
        url(world.a.admin.organization_id, "roles"),
        json={"name": "mixed", "permissions": ["zeta:read", "alpha:write", "keys:read"]},
        headers=world.a.admin.headers,
    )
    role = await assert_ok(response)
    caller = await create_creds(
        client,
        world.a.admin,
        {"name": "mixed key", "roles": ["developer"], "assignedRoleIds": [role["id"]]},
    )
    me = await assert_ok(await client.get("/v1/whoami", headers=caller.headers))
    assert me["permissions"] == ["alpha:write", "keys:read", "roles:read", "zeta:read"]


async def test_whoami_is_each_callers_own(client: Client, world: World) -> None:
    for org in (world.a, world.b):
        me = await assert_ok(await client.get("/v1/whoami", headers=org.admin.headers))
        assert me["id"] == org.admin.id
        assert me["organizationId"] == org.admin.organization_id
    a_me = await assert_ok(await client.get("/v1/whoami", headers=world.a.admin.headers))
    b_me = await assert_ok(await client.get("/v1/whoami", headers=world.b.admin.headers))
    assert a_me["name"] == "acme admin"
    assert b_me["name"] == "other admin"
