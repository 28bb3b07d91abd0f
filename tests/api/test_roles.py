"""Custom roles through the real app: CRUD, assignment, and no privilege escalation."""

import re
import uuid
from typing import Any

import pytest

from keysvc.errors import Forbidden
from keysvc.keys import STRONGER_KEY, change_key
from keysvc.models import KeyChange
from keysvc.roles import OWN_ROLES, ROLE_NAME_TAKEN, STRONGER_ACTOR, STRONGER_ROLE, change_role
from keysvc.state import STORE
from keysvc.timeutil import utcnow
from tests.helpers import (
    Client,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    create,
    create_creds,
    create_role,
)

ADMIN_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001"
DEVELOPER_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
QUERY_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000003"
SYSTEM_ROLES = [
    (ADMIN_ROLE, "admin", ["*"]),
    (DEVELOPER_ROLE, "developer", ["keys:read", "roles:read"]),
    (QUERY_ROLE, "query_endpoints", ["endpoints:query"]),
]
ROLE_FIELDS = {
    "id", "tenantId", "ownerId", "name", "type", "actors", "policies", "permissions",
    "createdAt", "updatedAt",
}  # fmt: skip
POLICY_FIELDS = {"id", "roleId", "tenantId", "allowDeny", "permissions", "resources", "tags"}
UTC_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z")
MISSING = "00000000-0000-4000-8000-000000000000"
BAD_PERMISSION = "must be *, namespace:* or namespace:action in lowercase, such as reports:read"
SYSTEM = "system roles cannot be changed or deleted"
NOT_FOUND = "role not found in this organization"
NEEDS_KEYS_UPDATE = "assigning a role to keys needs the permission keys:update"


def roles_url(creds: Creds, role: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/roles"
    return base if role is None else f"{base}/{role}"


def keys_url(creds: Creds, key: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/keys"
    return base if key is None else f"{base}/{key}"


def actor(key_id: str) -> str:
    return f"apiKey/{key_id}"


def allow(*permissions: str, **extra: Any) -> dict[str, Any]:
    return {"allowDeny": "ALLOW", "permissions": list(permissions), "resources": ["*"], **extra}


async def get_role(client: Client, caller: Creds, role_id: str) -> dict[str, Any]:
    result: dict[str, Any] = await assert_ok(
        await client.get(roles_url(caller, role_id), headers=caller.headers)
    )
    return result


async def get_key(client: Client, caller: Creds, key_id: str) -> dict[str, Any]:
    result: dict[str, Any] = await assert_ok(
        await client.get(keys_url(caller, key_id), headers=caller.headers)
    )
    return result


async def role_key(
    client: Client, admin: Creds, permissions: list[str], name: str = "custom"
) -> tuple[Creds, dict[str, Any]]:
    """A key whose only role is a new custom role with ``permissions``, made by ``admin``."""
    role = await create_role(client, admin, {"name": name, "permissions": permissions})
    creds = await create_creds(
        client, admin, {"name": f"{name} key", "assignedRoleIds": [role["id"]]}
    )
    return creds, await get_role(client, admin, role["id"])


def check_role_shape(
    role: dict[str, Any], org: str, name: str, kind: str, permissions: list[str]
) -> None:
    assert set(role) == ROLE_FIELDS
    assert uuid.UUID(role["id"])
    assert role["tenantId"] == f"organization/{org}"
    assert role["ownerId"] == f"organization/{org}"
    assert role["name"] == name
    assert role["type"] == kind
    assert role["permissions"] == permissions
    (policy,) = role["policies"]
    assert set(policy) == POLICY_FIELDS
    assert policy["roleId"] == role["id"]
    assert policy["tenantId"] == f"organization/{org}"
    assert policy["allowDeny"] == "ALLOW"
    assert policy["permissions"] == permissions
    assert policy["resources"] == ["*"]
    assert UTC_Z.fullmatch(role["createdAt"])
    assert UTC_Z.fullmatch(role["updatedAt"])


# Listing and shape


async def test_list_has_system_roles_then_custom_roles(client: Client, admin: Creds) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    zeta = await create_role(client, admin, {"name": "zeta", "permissions": ["reports:read"]})
    alpha = await create_role(client, admin, {"name": "alpha", "permissions": ["keys:read"]})

    listed = await assert_ok(await client.get(roles_url(admin), headers=admin.headers))
    assert [r["id"] for r in listed] == [
        ADMIN_ROLE, DEVELOPER_ROLE, QUERY_ROLE, alpha["id"], zeta["id"],
    ]  # fmt: skip
    for role, (role_id, name, permissions) in zip(listed[:3], SYSTEM_ROLES, strict=True):
        assert role["id"] == role_id
        check_role_shape(role, admin.organization_id, name, "system", permissions)
    assert listed[0]["actors"] == [actor(admin.id)]
    assert listed[1]["actors"] == [actor(dev.id)]
    assert listed[2]["actors"] == []
    check_role_shape(listed[3], admin.organization_id, "alpha", "custom", ["keys:read"])
    check_role_shape(listed[4], admin.organization_id, "zeta", "custom", ["reports:read"])
    assert listed[3] == alpha
    assert listed[4] == zeta


async def test_developer_can_read_roles(client: Client, admin: Creds) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    listed = await assert_ok(await client.get(roles_url(admin), headers=dev.headers))
    assert [r["name"] for r in listed] == ["admin", "developer", "query_endpoints"]
    role = await get_role(client, dev, DEVELOPER_ROLE)
    assert role["actors"] == [actor(dev.id)]


async def test_query_endpoints_cannot_read_roles(client: Client, admin: Creds) -> None:
    query = await create_creds(client, admin, {"name": "q", "roles": ["query_endpoints"]})
    response = await client.get(roles_url(admin), headers=query.headers)
    await assert_error(response, 403, "this key lacks the permission roles:read")
    response = await client.get(roles_url(admin, ADMIN_ROLE), headers=query.headers)
    await assert_error(response, 403, "this key lacks the permission roles:read")


# Create


@pytest.mark.parametrize(
    ("body", "permissions"),
    [
        ({"permissions": ["reports:read", "keys:read"]}, ["reports:read", "keys:read"]),
        ({"policies": [allow("reports:read", "reports:write")]}, ["reports:read", "reports:write"]),
        ({"policies": [allow("reports:read", tags={})]}, ["reports:read"]),
        (
            {
                "permissions": ["reports:read", "keys:read"],
                "policies": [allow("reports:write", "reports:read"), allow("keys:read", "x:y")],
            },
            ["reports:read", "keys:read", "reports:write", "x:y"],
        ),
        ({"permissions": []}, []),
        ({}, []),
        ({"permissions": ["*"]}, ["*"]),
        (
            {"permissions": ["reports:*", "control-plane:organization:view"]},
            ["reports:*", "control-plane:organization:view"],
        ),
    ],
)
async def test_create_merges_permissions_and_policies(
    client: Client, admin: Creds, body: dict[str, Any], permissions: list[str]
) -> None:
    created = await create_role(client, admin, {"name": " reporting ", **body})
    check_role_shape(created, admin.organization_id, "reporting", "custom", permissions)
    assert created["actors"] == []
    assert created["createdAt"] == created["updatedAt"]
    assert created["id"] not in {ADMIN_ROLE, DEVELOPER_ROLE, QUERY_ROLE}
    assert await get_role(client, admin, created["id"]) == created


async def test_create_with_actors(client: Client, admin: Creds) -> None:
    one = await create_creds(client, admin, {"name": "one", "roles": ["developer"]})
    two = await create_creds(client, admin, {"name": "two", "roles": ["developer"]})
    created = await create_role(
        client,
        admin,
        {"name": "ops", "permissions": ["keys:read"], "actors": [actor(two.id), actor(one.id)]},
    )
    assert created["actors"] == [actor(one.id), actor(two.id)]  # in key creation order
    key = await get_key(client, admin, one.id)
    assert key["assignedRoles"] == [
        {"roleId": DEVELOPER_ROLE, "roleName": "developer", "roleType": "system"},
        {"roleId": created["id"], "roleName": "ops", "roleType": "custom"},
    ]
    assert key["roles"] == ["developer"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "name: is required"),
        ({"name": "  "}, "name: must be 1 to 255 characters"),
        ({"name": "r", "colour": "red"}, "colour: is not a known field"),
        (
            {"name": "r", "policies": [{**allow("reports:read"), "allowDeny": "DENY"}]},
            "policies.0.allowDeny: only ALLOW is supported: keysvc roles grant",
        ),
        (
            {"name": "r", "policies": [{**allow("reports:read"), "resources": ["reports/1"]}]},
            'policies.0.resources: keysvc grants permissions on every resource: use ["*"]',
        ),
        (
            {"name": "r", "policies": [{**allow("reports:read"), "resources": []}]},
            'policies.0.resources: keysvc grants permissions on every resource: use ["*"]',
        ),
        (
            {"name": "r", "policies": [{**allow("reports:read"), "resources": ["*", "x"]}]},
            'policies.0.resources: keysvc grants permissions on every resource: use ["*"]',
        ),
        (
            {"name": "r", "policies": [allow("reports:read", tags={"grants": ["db1"]})]},
            "policies.0.tags: are not supported by keysvc: send {} or leave tags out",
        ),
        (
            {"name": "r", "policies": [allow("reports:read", tags={"env": "prod"})]},
            "policies.0.tags.env: is not a known field",
        ),
        (
            {"name": "r", "policies": [allow("reports:read"), allow("Reports:Read")]},
            f"policies.1.permissions.0: {BAD_PERMISSION}",
        ),
        (
            {"name": "r", "policies": [{"allowDeny": "ALLOW", "permissions": ["a:b"]}]},
            "policies.0.resources: is required",
        ),
        ({"name": "r", "permissions": ["Reports:Read"]}, f"permissions.0: {BAD_PERMISSION}"),
        ({"name": "r", "permissions": ["a:b", "reports"]}, f"permissions.1: {BAD_PERMISSION}"),
        ({"name": "r", "permissions": ["reports:"]}, f"permissions.0: {BAD_PERMISSION}"),
        ({"name": "r", "permissions": [":read"]}, f"permissions.0: {BAD_PERMISSION}"),
        ({"name": "r", "permissions": ["*:read"]}, f"permissions.0: {BAD_PERMISSION}"),
        ({"name": "r", "permissions": ["**"]}, f"permissions.0: {BAD_PERMISSION}"),
        ({"name": "r", "permissions": ["a b:c"]}, f"permissions.0: {BAD_PERMISSION}"),
        ({"name": "r", "permissions": ["a:" + "b" * 127]}, f"permissions.0: {BAD_PERMISSION}"),
        ({"name": "r", "permissions": "keys:read"}, "permissions: must be an array"),
        (
            {"name": "r", "permissions": [f"p{n}:read" for n in range(101)]},
            "permissions: must have at most 100 entries",
        ),
        (
            {"name": "r", "actors": [f"user/{MISSING}"]},
            "actors.0: must be apiKey/<key UUID>; keysvc has no users",
        ),
        (
            {"name": "r", "actors": [MISSING]},
            "actors.0: must be apiKey/<key UUID>; keysvc has no users",
        ),
    ],
)
async def test_create_invalid_body(
    client: Client, admin: Creds, body: dict[str, Any], message: str
) -> None:
    response = await client.post(roles_url(admin), json=body, headers=admin.headers)
    await assert_error(response, 400, message)
    listed = await assert_ok(await client.get(roles_url(admin), headers=admin.headers))
    assert len(listed) == 3  # nothing was created


async def test_create_actor_unknown_key(client: Client, admin: Creds) -> None:
    response = await client.post(
        roles_url(admin), json={"name": "r", "actors": [actor(MISSING)]}, headers=admin.headers
    )
    await assert_error(response, 400, f"actors: no key {MISSING} in this organization")


# Names


@pytest.mark.parametrize("name", ["admin", "developer", "query_endpoints", " admin "])
async def test_name_of_a_system_role_is_taken(client: Client, admin: Creds, name: str) -> None:
    response = await client.post(roles_url(admin), json={"name": name}, headers=admin.headers)
    await assert_error(response, 409, ROLE_NAME_TAKEN)


async def test_name_unique_within_organization(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    first = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    response = await client.post(
        roles_url(admin), json={"name": "ops", "permissions": ["x:y"]}, headers=admin.headers
    )
    await assert_error(response, 409, ROLE_NAME_TAKEN)
    assert await get_role(client, admin, first["id"]) == first
    # The same name is free in another organization.
    other = await create_role(client, other_admin, {"name": "ops", "permissions": ["keys:read"]})
    assert other["id"] != first["id"]
    assert other["tenantId"] == f"organization/{other_admin.organization_id}"


async def test_rename_to_taken_name_is_conflict(client: Client, admin: Creds) -> None:
    ops = await create_role(client, admin, {"name": "ops"})
    await create_role(client, admin, {"name": "audit"})
    for taken in ("audit", "developer"):
        response = await client.patch(
            roles_url(admin, ops["id"]), json={"name": taken}, headers=admin.headers
        )
        await assert_error(response, 409, ROLE_NAME_TAKEN)
    assert (await get_role(client, admin, ops["id"]))["name"] == "ops"
    # Keeping its own name is no conflict.
    same = await client.patch(
        roles_url(admin, ops["id"]), json={"name": "ops"}, headers=admin.headers
    )
    assert (await assert_ok(same))["name"] == "ops"


# Read, update, delete


async def test_get_system_and_custom_role(client: Client, admin: Creds) -> None:
    system = await get_role(client, admin, DEVELOPER_ROLE)
    check_role_shape(
        system, admin.organization_id, "developer", "system", ["keys:read", "roles:read"]
    )
    assert system["createdAt"] == "2026-01-01T00:00:00Z"
    created = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    assert await get_role(client, admin, created["id"]) == created


async def test_get_unknown_role(client: Client, admin: Creds) -> None:
    response = await client.get(roles_url(admin, MISSING), headers=admin.headers)
    await assert_error(response, 404, NOT_FOUND)


async def test_patch_replaces_and_renames(client: Client, admin: Creds, clock: FakeClock) -> None:
    one = await create_creds(client, admin, {"name": "one", "roles": ["developer"]})
    two = await create_creds(client, admin, {"name": "two", "roles": ["developer"]})
    created = await create_role(
        client,
        admin,
        {"name": "ops", "permissions": ["keys:read", "reports:read"], "actors": [actor(one.id)]},
    )
    clock.advance(seconds=30)
    url = roles_url(admin, created["id"])

    patched = await assert_ok(
        await client.patch(
            url,
            json={
                "name": "operations",
                "permissions": ["reports:write"],
                "actors": [actor(two.id)],
            },
            headers=admin.headers,
        )
    )
    check_role_shape(patched, admin.organization_id, "operations", "custom", ["reports:write"])
    assert patched["id"] == created["id"]
    assert patched["actors"] == [actor(two.id)]
    assert patched["createdAt"] == created["createdAt"]
    assert patched["updatedAt"] != created["updatedAt"]
    assert patched["updatedAt"] > created["updatedAt"]
    assert await get_role(client, admin, created["id"]) == patched
    assert [r["roleName"] for r in (await get_key(client, admin, one.id))["assignedRoles"]] == [
        "developer"
    ]
    assert [r["roleName"] for r in (await get_key(client, admin, two.id))["assignedRoles"]] == [
        "developer",
        "operations",
    ]

    # Fields left out stay as they are; policies replace permissions too.
    clock.advance(seconds=30)
    again = await assert_ok(
        await client.patch(url, json={"policies": [allow("a:b", "c:d")]}, headers=admin.headers)
    )
    assert again["name"] == "operations"
    assert again["permissions"] == ["a:b", "c:d"]
    assert again["actors"] == [actor(two.id)]
    assert again["updatedAt"] > patched["updatedAt"]


async def test_patch_invalid_body(client: Client, admin: Creds) -> None:
    created = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    response = await client.patch(
        roles_url(admin, created["id"]),
        json={"policies": [{**allow("a:b"), "allowDeny": "DENY"}]},
        headers=admin.headers,
    )
    await assert_error(
        response, 400, "policies.0.allowDeny: only ALLOW is supported: keysvc roles grant"
    )
    assert await get_role(client, admin, created["id"]) == created


async def test_delete_role(client: Client, admin: Creds) -> None:
    created = await create_role(client, admin, {"name": "ops"})
    url = roles_url(admin, created["id"])
    assert await assert_ok(await client.delete(url, headers=admin.headers)) is None
    await assert_error(await client.get(url, headers=admin.headers), 404, NOT_FOUND)
    await assert_error(await client.delete(url, headers=admin.headers), 404, NOT_FOUND)
    await assert_error(
        await client.patch(url, json={"name": "x"}, headers=admin.headers), 404, NOT_FOUND
    )
    # The name is free again.
    await create_role(client, admin, {"name": "ops"})


async def test_delete_role_held_by_keys_is_conflict(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    one = await create_creds(client, admin, {"name": "one", "assignedRoleIds": [role["id"]]})
    two = await create_creds(
        client, admin, {"name": "two", "roles": ["developer"], "assignedRoleIds": [role["id"]]}
    )
    url = roles_url(admin, role["id"])
    response = await client.delete(url, headers=admin.headers)
    await assert_error(response, 409, "role is assigned to 2 key(s); unassign it first")

    await assert_ok(
        await client.patch(
            keys_url(admin, one.id), json={"roles": ["developer"]}, headers=admin.headers
        )
    )
    response = await client.delete(url, headers=admin.headers)
    await assert_error(response, 409, "role is assigned to 1 key(s); unassign it first")
    assert (await get_role(client, admin, role["id"]))["actors"] == [actor(two.id)]

    await assert_ok(await client.patch(url, json={"actors": []}, headers=admin.headers))
    await assert_ok(await client.delete(url, headers=admin.headers))
    await assert_error(await client.get(url, headers=admin.headers), 404, NOT_FOUND)


@pytest.mark.parametrize("role_id", [ADMIN_ROLE, DEVELOPER_ROLE, QUERY_ROLE])
@pytest.mark.parametrize(
    ("method", "body"),
    [
        ("PATCH", {"name": "renamed"}),
        ("PATCH", {"permissions": ["keys:read"]}),
        ("PATCH", {"actors": []}),
        ("DELETE", None),
    ],
)
async def test_system_roles_cannot_change(
    client: Client, admin: Creds, role_id: str, method: str, body: dict[str, Any] | None
) -> None:
    before = await get_role(client, admin, role_id)
    response = await client.request(
        method, roles_url(admin, role_id), json=body, headers=admin.headers
    )
    await assert_error(response, 403, SYSTEM)
    assert await get_role(client, admin, role_id) == before


# Assignment to keys


async def test_custom_role_on_key_create(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    key = (await create(client, admin, {"name": "k", "assignedRoleIds": [role["id"]]}))["key"]
    assert key["assignedRoles"] == [{"roleId": role["id"], "roleName": "ops", "roleType": "custom"}]
    assert key["roles"] == []  # the deprecated field names system roles only
    assert await get_key(client, admin, key["id"]) == key
    assert (await get_role(client, admin, role["id"]))["actors"] == [actor(key["id"])]

    both = (
        await create(
            client, admin, {"name": "b", "roles": ["developer"], "assignedRoleIds": [role["id"]]}
        )
    )["key"]
    assert both["roles"] == ["developer"]
    assert [r["roleType"] for r in both["assignedRoles"]] == ["system", "custom"]


async def test_custom_role_via_actors_shows_on_key(client: Client, admin: Creds) -> None:
    key = await create_creds(client, admin, {"name": "k", "roles": ["query_endpoints"]})
    role = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    await assert_ok(
        await client.patch(
            roles_url(admin, role["id"]), json={"actors": [actor(key.id)]}, headers=admin.headers
        )
    )
    read = await get_key(client, admin, key.id)
    assert read["assignedRoles"] == [
        {"roleId": QUERY_ROLE, "roleName": "query_endpoints", "roleType": "system"},
        {"roleId": role["id"], "roleName": "ops", "roleType": "custom"},
    ]
    assert read["roles"] == ["query_endpoints"]
    # The new role governs the key's very next request.
    await assert_ok(await client.get(keys_url(admin, admin.id), headers=key.headers))


async def test_rename_shows_on_keys(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    key = await create_creds(client, admin, {"name": "k", "assignedRoleIds": [role["id"]]})
    await assert_ok(
        await client.patch(
            roles_url(admin, role["id"]), json={"name": "run"}, headers=admin.headers
        )
    )
    assert (await get_key(client, admin, key.id))["assignedRoles"] == [
        {"roleId": role["id"], "roleName": "run", "roleType": "custom"}
    ]


async def test_custom_role_grants_exactly_its_permissions(client: Client, admin: Creds) -> None:
    worker, role = await role_key(client, admin, ["keys:read", "keys:create"])
    listed = await assert_ok(await client.get(keys_url(admin), headers=worker.headers))
    assert {k["id"] for k in listed} == {admin.id, worker.id}
    await get_key(client, worker, admin.id)
    made = await create_creds(client, worker, {"name": "made", "assignedRoleIds": [role["id"]]})
    await get_key(client, made, worker.id)

    response = await client.delete(keys_url(admin, made.id), headers=worker.headers)
    await assert_error(response, 403, "this key lacks the permission keys:delete")
    response = await client.patch(
        keys_url(admin, made.id), json={"name": "x"}, headers=worker.headers
    )
    await assert_error(response, 403, "this key lacks the permission keys:update")
    response = await client.get(roles_url(admin), headers=worker.headers)
    await assert_error(response, 403, "this key lacks the permission roles:read")
    response = await client.post(roles_url(admin), json={"name": "r"}, headers=worker.headers)
    await assert_error(response, 403, "this key lacks the permission roles:write")
    await get_key(client, admin, made.id)  # still there


async def test_narrowing_a_role_takes_effect(client: Client, admin: Creds) -> None:
    worker, role = await role_key(client, admin, ["keys:read", "keys:delete"])
    victim = await create_creds(client, admin, {"name": "v", "roles": ["developer"]})
    await assert_ok(
        await client.patch(
            roles_url(admin, role["id"]), json={"permissions": ["keys:read"]}, headers=admin.headers
        )
    )
    response = await client.delete(keys_url(admin, victim.id), headers=worker.headers)
    await assert_error(response, 403, "this key lacks the permission keys:delete")


# Actors


async def test_removing_a_keys_only_role_is_conflict(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    only = await create_creds(client, admin, {"name": "only", "assignedRoleIds": [role["id"]]})
    more = await create_creds(
        client, admin, {"name": "more", "roles": ["developer"], "assignedRoleIds": [role["id"]]}
    )
    url = roles_url(admin, role["id"])
    for actors in ([], [actor(more.id)]):
        response = await client.patch(url, json={"actors": actors}, headers=admin.headers)
        await assert_error(response, 409, f"actors: key {only.id} would be left with no role")
    assert (await get_role(client, admin, role["id"]))["actors"] == [actor(only.id), actor(more.id)]

    # A key with another role may leave.
    patched = await assert_ok(
        await client.patch(url, json={"actors": [actor(only.id)]}, headers=admin.headers)
    )
    assert patched["actors"] == [actor(only.id)]
    assert (await get_key(client, admin, more.id))["assignedRoles"] == [
        {"roleId": DEVELOPER_ROLE, "roleName": "developer", "roleType": "system"}
    ]


async def test_actors_of_another_organization_are_rejected(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    foreign = other_admin.id
    message = f"actors: no key {foreign} in this organization"
    mine = await create_creds(client, admin, {"name": "mine", "roles": ["developer"]})
    response = await client.post(
        roles_url(admin),
        json={"name": "r", "actors": [actor(mine.id), actor(foreign)]},
        headers=admin.headers,
    )
    await assert_error(response, 400, message)
    listed = await assert_ok(await client.get(roles_url(admin), headers=admin.headers))
    assert [r["name"] for r in listed] == ["admin", "developer", "query_endpoints"]

    role = await create_role(client, admin, {"name": "r"})
    response = await client.patch(
        roles_url(admin, role["id"]), json={"actors": [actor(foreign)]}, headers=admin.headers
    )
    await assert_error(response, 400, message)
    assert await get_role(client, admin, role["id"]) == role
    theirs = await assert_ok(
        await client.get(
            f"/v1/organizations/{other_admin.organization_id}/keys/{foreign}",
            headers=other_admin.headers,
        )
    )
    assert [r["roleName"] for r in theirs["assignedRoles"]] == ["admin"]


# No privilege escalation


async def test_developer_cannot_write_roles(client: Client, admin: Creds) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    role = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    message = "this key lacks the permission roles:write"
    response = await client.post(
        roles_url(admin), json={"name": "r", "permissions": ["keys:read"]}, headers=dev.headers
    )
    await assert_error(response, 403, message)
    url = roles_url(admin, role["id"])
    await assert_error(
        await client.patch(url, json={"name": "x"}, headers=dev.headers), 403, message
    )
    await assert_error(await client.delete(url, headers=dev.headers), 403, message)
    assert await get_role(client, admin, role["id"]) == role


@pytest.mark.parametrize(
    ("body", "lacking"),
    [
        ({"permissions": ["keys:create"]}, "keys:create"),
        ({"permissions": ["keys:read", "keys:create"]}, "keys:create"),
        ({"policies": [allow("keys:read"), allow("keys:create")]}, "keys:create"),
        ({"permissions": ["keys:*"]}, "keys:*"),
        ({"permissions": ["*"]}, "*"),
        ({"permissions": ["roles:*"]}, "roles:*"),
        ({"permissions": ["reports:read"]}, "reports:read"),
    ],
)
async def test_cannot_create_role_beyond_own_permissions(
    client: Client, admin: Creds, body: dict[str, Any], lacking: str
) -> None:
    writer, _ = await role_key(client, admin, ["roles:write", "keys:read"])
    response = await client.post(
        roles_url(admin), json={"name": "wider", **body}, headers=writer.headers
    )
    await assert_error(response, 403, f"cannot grant the permission {lacking}: this key lacks it")
    listed = await assert_ok(await client.get(roles_url(admin), headers=admin.headers))
    assert "wider" not in [r["name"] for r in listed]


async def test_may_create_role_within_own_permissions(client: Client, admin: Creds) -> None:
    writer, _ = await role_key(client, admin, ["roles:write", "keys:read"])
    created = await create_role(
        client, writer, {"name": "narrow", "permissions": ["keys:read", "roles:write"]}
    )
    assert created["permissions"] == ["keys:read", "roles:write"]


@pytest.mark.parametrize(
    "body",
    [
        {"permissions": ["roles:write", "keys:read", "keys:create"]},
        {"policies": [allow("keys:create")]},
    ],
)
async def test_cannot_patch_role_wider(client: Client, admin: Creds, body: dict[str, Any]) -> None:
    writer, own = await role_key(client, admin, ["roles:write", "keys:read"])
    other = await create_role(client, admin, {"name": "other", "permissions": ["keys:read"]})
    message = "cannot grant the permission keys:create: this key lacks it"
    for role in (own, other):
        response = await client.patch(
            roles_url(admin, role["id"]), json=body, headers=writer.headers
        )
        await assert_error(response, 403, message)
        assert await get_role(client, admin, role["id"]) == role
    # And the writer still cannot create keys.
    response = await client.post(
        keys_url(admin), json={"name": "x", "assignedRoleIds": [own["id"]]}, headers=writer.headers
    )
    await assert_error(response, 403, "this key lacks the permission keys:create")


async def test_actors_need_keys_update(client: Client, admin: Creds) -> None:
    writer, _ = await role_key(client, admin, ["roles:write", "keys:read"])
    target = await create_creds(client, admin, {"name": "t", "roles": ["developer"]})
    response = await client.post(
        roles_url(admin),
        json={"name": "r", "permissions": ["keys:read"], "actors": [actor(target.id)]},
        headers=writer.headers,
    )
    await assert_error(response, 403, NEEDS_KEYS_UPDATE)
    role = await create_role(client, admin, {"name": "ops", "permissions": ["keys:read"]})
    for actors in ([actor(target.id)], [actor(writer.id)], []):
        response = await client.patch(
            roles_url(admin, role["id"]), json={"actors": actors}, headers=writer.headers
        )
        await assert_error(response, 403, NEEDS_KEYS_UPDATE)
    assert await get_role(client, admin, role["id"]) == role


MANAGER = ["keys:update", "keys:create", "keys:read", "roles:write"]


async def test_cannot_add_self_to_a_stronger_role(client: Client, admin: Creds) -> None:
    manager, own = await role_key(client, admin, MANAGER)
    strong = await create_role(
        client, admin, {"name": "strong", "permissions": ["keys:read", "keys:delete"]}
    )
    message = "cannot grant the permission keys:delete: this key lacks it"
    response = await client.patch(
        roles_url(admin, strong["id"]),
        json={"actors": [actor(manager.id)]},
        headers=manager.headers,
    )
    # Refused before its body is read: the role holds a permission the key lacks.
    await assert_error(response, 403, STRONGER_ROLE)
    assert await get_role(client, admin, strong["id"]) == strong

    # Nor by creating such a role with itself as actor...
    response = await client.post(
        roles_url(admin),
        json={"name": "mine", "permissions": ["keys:delete"], "actors": [actor(manager.id)]},
        headers=manager.headers,
    )
    await assert_error(response, 403, message)
    # ...nor by widening its own role while it holds it...
    response = await client.patch(
        roles_url(admin, own["id"]),
        json={"permissions": [*MANAGER, "keys:delete"], "actors": [actor(manager.id)]},
        headers=manager.headers,
    )
    await assert_error(response, 403, message)
    # ...nor by giving itself the role through the keys API...
    response = await client.patch(
        keys_url(admin, manager.id),
        json={"assignedRoleIds": [own["id"], strong["id"]]},
        headers=manager.headers,
    )
    await assert_error(
        response, 403, "a key cannot change its own assignedRoleIds: use another key to change it"
    )
    # ...nor to a peer of its own strength.
    peer = await create_creds(client, admin, {"name": "peer", "assignedRoleIds": [own["id"]]})
    response = await client.patch(
        keys_url(admin, peer.id),
        json={"assignedRoleIds": [own["id"], strong["id"]]},
        headers=manager.headers,
    )
    await assert_error(
        response, 403, "cannot grant role strong: this key lacks the permission keys:delete"
    )
    read = await get_key(client, admin, manager.id)
    assert [r["roleId"] for r in read["assignedRoles"]] == [own["id"]]
    victim = await create_creds(client, admin, {"name": "v", "roles": ["developer"]})
    response = await client.delete(keys_url(admin, victim.id), headers=manager.headers)
    await assert_error(response, 403, "this key lacks the permission keys:delete")


async def test_may_add_keys_to_a_role_it_covers(client: Client, admin: Creds) -> None:
    manager, _ = await role_key(client, admin, MANAGER)
    _, reading = await role_key(client, admin, ["keys:read"], name="reader")
    target = await create_creds(client, admin, {"name": "t", "assignedRoleIds": [reading["id"]]})
    weak = await create_role(client, admin, {"name": "weak", "permissions": ["keys:read"]})
    patched = await assert_ok(
        await client.patch(
            roles_url(admin, weak["id"]),
            json={"actors": [actor(target.id)]},
            headers=manager.headers,
        )
    )
    assert patched["actors"] == [actor(target.id)]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"roles": ["admin"]}, "cannot grant role admin: this key lacks the permission *"),
        (
            {"assignedRoleIds": [ADMIN_ROLE]},
            "cannot grant role admin: this key lacks the permission *",
        ),
        (
            {"roles": ["developer"]},
            "cannot grant role developer: this key lacks the permission roles:read",
        ),
    ],
)
async def test_cannot_create_or_patch_key_with_stronger_system_role(
    client: Client, admin: Creds, body: dict[str, Any], message: str
) -> None:
    manager, own = await role_key(client, admin, MANAGER)
    response = await client.post(
        keys_url(admin), json={"name": "x", **body}, headers=manager.headers
    )
    await assert_error(response, 403, message)
    peer = await create_creds(client, admin, {"name": "peer", "assignedRoleIds": [own["id"]]})
    response = await client.patch(keys_url(admin, peer.id), json=body, headers=manager.headers)
    await assert_error(response, 403, message)
    read = await get_key(client, admin, peer.id)
    assert [r["roleId"] for r in read["assignedRoles"]] == [own["id"]]
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    assert {k["id"] for k in listed} == {admin.id, manager.id, peer.id}


@pytest.mark.parametrize(
    ("held", "wanted", "lacking"),
    [
        (["reports:*"], ["reports:read"], None),
        (["reports:*"], ["reports:read", "reports:export:csv"], None),
        (["reports:*"], ["reports:*"], None),
        (["reports:*"], ["keys:read"], "keys:read"),
        (["reports:*"], ["*"], "*"),
        (["reports:*"], ["reportsx:read"], "reportsx:read"),
        (["reports:read"], ["reports:*"], "reports:*"),
        (["reports:read"], ["reports:write"], "reports:write"),
        (["*"], ["anything:at:all", "*"], None),
    ],
)
async def test_namespace_wildcards_when_granting(
    client: Client, admin: Creds, held: list[str], wanted: list[str], lacking: str | None
) -> None:
    writer, _ = await role_key(client, admin, ["roles:write", *held])
    response = await client.post(
        roles_url(admin), json={"name": "granted", "permissions": wanted}, headers=writer.headers
    )
    if lacking is None:
        assert (await assert_ok(response))["permissions"] == wanted
    else:
        await assert_error(
            response, 403, f"cannot grant the permission {lacking}: this key lacks it"
        )


async def test_namespace_wildcard_grants_management_actions(client: Client, admin: Creds) -> None:
    keeper, _ = await role_key(client, admin, ["keys:*"])
    # A victim no stronger than the keeper: keys:* covers keys:read.
    _, reading = await role_key(client, admin, ["keys:read"], name="reader")
    victim = await create_creds(client, admin, {"name": "v", "assignedRoleIds": [reading["id"]]})
    await assert_ok(await client.delete(keys_url(admin, victim.id), headers=keeper.headers))
    response = await client.get(roles_url(admin), headers=keeper.headers)
    await assert_error(response, 403, "this key lacks the permission roles:read")


HELPDESK = ["keys:read", "keys:update", "keys:delete"]


def _unused(key: dict[str, Any]) -> dict[str, Any]:
    """The key but its usedAt, which each authenticated request may move."""
    return {name: value for name, value in key.items() if name != "usedAt"}


STRONGER = STRONGER_KEY


async def test_cannot_change_or_delete_a_stronger_key(client: Client, admin: Creds) -> None:
    """keys:update and keys:delete reach only keys whose permissions the caller holds:
    otherwise a help desk key could re-enable, unrestrict, demote or delete an admin's."""
    helpdesk, own = await role_key(client, admin, HELPDESK, name="helpdesk")
    spare = await create(
        client,
        admin,
        {"name": "break-glass", "roles": ["admin"], "state": "disabled",
         "ipAccessList": [{"source": "10.1.2.3/32"}]},
    )  # fmt: skip
    strong = spare["key"]
    for target, body in (
        (strong["id"], {"state": "enabled", "ipAccessList": []}),
        (strong["id"], {"name": "renamed"}),
        (admin.id, {"assignedRoleIds": [own["id"]]}),  # a role it may grant, to demote
    ):
        response = await client.patch(keys_url(admin, target), json=body, headers=helpdesk.headers)
        await assert_error(response, 403, STRONGER)
    for target in (strong["id"], admin.id):
        response = await client.delete(keys_url(admin, target), headers=helpdesk.headers)
        await assert_error(response, 403, STRONGER)
    assert await get_key(client, admin, strong["id"]) == strong  # untouched
    assert [r["roleId"] for r in (await get_key(client, admin, admin.id))["assignedRoles"]] == [
        ADMIN_ROLE
    ]
    # Stronger in one permission is enough to refuse: developer holds roles:read.
    developer = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    response = await client.patch(
        keys_url(admin, developer.id), json={"state": "disabled"}, headers=helpdesk.headers
    )
    await assert_error(response, 403, STRONGER)
    # A key it covers, it may change and delete.
    _, reading = await role_key(client, admin, ["keys:read"], name="reader")
    weaker = await create_creds(client, admin, {"name": "w", "assignedRoleIds": [reading["id"]]})
    response = await client.patch(
        keys_url(admin, weaker.id), json={"state": "disabled"}, headers=helpdesk.headers
    )
    assert (await assert_ok(response))["state"] == "disabled"
    await assert_ok(await client.delete(keys_url(admin, weaker.id), headers=helpdesk.headers))
    # An unknown key is still a 404, not a 403.
    response = await client.delete(keys_url(admin, str(uuid.uuid4())), headers=helpdesk.headers)
    await assert_error(response, 404, "key not found in this organization")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ipAccessList", [{"source": "0.0.0.0/0"}]),
        ("expireAt", None),
        ("rateLimit", {"limit": 1000000, "windowSeconds": 1}),
        ("state", "disabled"),
        ("roles", ["developer"]),
        ("assignedRoleIds", [DEVELOPER_ROLE]),
    ],
)
async def test_a_key_cannot_lift_its_own_restrictions(
    client: Client, admin: Creds, field: str, value: Any
) -> None:
    """A key may rename itself, and nothing else: its access is another key's to change."""
    _, role = await role_key(client, admin, [*HELPDESK, "roles:read"], name="self")
    restricted = await create_creds(
        client,
        admin,
        {"name": "restricted", "assignedRoleIds": [role["id"]],
         "ipAccessList": [{"source": "127.0.0.1/32"}], "expireAt": "2099-01-01T00:00:00Z",
         "rateLimit": {"limit": 50, "windowSeconds": 60}},
    )  # fmt: skip
    before = await get_key(client, admin, restricted.id)
    response = await client.patch(
        keys_url(admin, restricted.id), json={field: value}, headers=restricted.headers
    )
    await assert_error(
        response, 403, f"a key cannot change its own {field}: use another key to change it"
    )
    assert _unused(await get_key(client, admin, restricted.id)) == _unused(before)
    response = await client.patch(
        keys_url(admin, restricted.id), json={"name": "mine"}, headers=restricted.headers
    )
    assert (await assert_ok(response))["name"] == "mine"


async def test_cannot_change_a_stronger_role_or_its_stronger_holders(
    client: Client, admin: Creds
) -> None:
    """roles:write reaches only roles, and keys through actors, that the caller covers:
    otherwise it could empty a role that admins' keys depend on, or take it from them."""
    manager, own = await role_key(client, admin, MANAGER)
    ops = await create_role(client, admin, {"name": "ops", "permissions": ["keys:*"]})
    for body in ({"permissions": ["keys:read"]}, {"name": "renamed"}):
        response = await client.patch(
            roles_url(admin, ops["id"]), json=body, headers=manager.headers
        )
        await assert_error(
            response,
            403,
            STRONGER_ROLE,
        )
    response = await client.delete(roles_url(admin, ops["id"]), headers=manager.headers)
    await assert_error(response, 403, STRONGER_ROLE)
    assert await get_role(client, admin, ops["id"]) == ops
    # Roles it covers, but not a key stronger than itself: the role is neither taken
    # from such a key nor given to it.
    weak = await create_role(client, admin, {"name": "weak", "permissions": ["keys:read"]})
    strong = await create_creds(
        client, admin, {"name": "s", "roles": ["query_endpoints"], "assignedRoleIds": [weak["id"]]}
    )
    spare = await create_role(client, admin, {"name": "spare", "permissions": ["keys:read"]})
    lacking = STRONGER_ACTOR
    for role, actors in ((weak, []), (spare, [actor(strong.id)])):
        response = await client.patch(
            roles_url(admin, role["id"]), json={"actors": actors}, headers=manager.headers
        )
        await assert_error(response, 403, lacking)
    assert (await get_role(client, admin, weak["id"]))["actors"] == [actor(strong.id)]
    assert (await get_role(client, admin, spare["id"]))["actors"] == []
    # Keys it covers move freely; a role it covers is its to change and, once no key
    # holds it, to delete.
    covered = await create_creds(client, admin, {"name": "c", "assignedRoleIds": [own["id"]]})
    both = [actor(strong.id), actor(covered.id)]
    response = await client.patch(
        roles_url(admin, weak["id"]), json={"actors": both}, headers=manager.headers
    )
    assert sorted((await assert_ok(response))["actors"]) == sorted(both)
    response = await client.patch(
        roles_url(admin, own["id"]), json={"name": "mine"}, headers=manager.headers
    )
    assert (await assert_ok(response))["name"] == "mine"
    await assert_ok(await client.delete(roles_url(admin, spare["id"]), headers=manager.headers))


async def test_a_role_change_reaches_no_stronger_holder(client: Client, admin: Creds) -> None:
    """Changing a role's permissions changes every key that holds it: a holder stronger
    than the caller is neither demoted nor promoted that way, nor through a new role."""
    writer, _ = await role_key(
        client, admin, ["roles:write", "keys:update", "reports:read"], name="writer"
    )
    shared = await create_role(client, admin, {"name": "shared", "permissions": ["reports:read"]})
    _, billing = await role_key(client, admin, ["billing:admin"], name="billing")
    strong = await create_creds(
        client, admin, {"name": "s", "assignedRoleIds": [shared["id"], billing["id"]]}
    )
    shared = await get_role(client, admin, shared["id"])  # now held by the strong key
    for permissions in ([], ["keys:update", "roles:write"]):
        response = await client.patch(
            roles_url(admin, shared["id"]),
            json={"permissions": permissions},
            headers=writer.headers,
        )
        await assert_error(response, 403, STRONGER_ACTOR)
    assert await get_role(client, admin, shared["id"]) == shared
    # A rename, or the same permissions again, changes no key: allowed.
    for body in ({"name": "shared-2"}, {"permissions": ["reports:read"]}):
        response = await client.patch(
            roles_url(admin, shared["id"]), json=body, headers=writer.headers
        )
        await assert_ok(response)
    # Nor can a new role be handed to a stronger key, or to an admin.
    for target in (strong.id, admin.id):
        response = await client.post(
            roles_url(admin),
            json={"name": f"sneak-{target[:8]}", "permissions": ["reports:read"],
                  "actors": [actor(target)]},
            headers=writer.headers,
        )  # fmt: skip
        await assert_error(response, 403, STRONGER_ACTOR)
    names = {role["name"] for role in await assert_ok(
        await client.get(roles_url(admin), headers=admin.headers)
    )}  # fmt: skip
    assert not any(name.startswith("sneak") for name in names)


async def test_a_key_cannot_move_roles_onto_or_off_itself(client: Client, admin: Creds) -> None:
    """Its roles are for another key to change, through actors as through PATCH."""
    writer, own = await role_key(client, admin, ["roles:write", "keys:update", "keys:read"])
    other = await create_role(client, admin, {"name": "other", "permissions": ["keys:read"]})
    attempts = [
        ("patch", roles_url(admin, other["id"]), {"actors": [actor(writer.id)]}),
        ("patch", roles_url(admin, own["id"]), {"actors": []}),
        ("post", roles_url(admin), {"name": "mine", "actors": [actor(writer.id)]}),
    ]
    for method, url, body in attempts:
        response = await client.request(method, url, json=body, headers=writer.headers)
        await assert_error(response, 403, OWN_ROLES)
    read = await get_key(client, admin, writer.id)
    assert [r["roleId"] for r in read["assignedRoles"]] == [own["id"]]


async def test_a_key_change_is_checked_again_as_changed(client: Client, admin: Creds) -> None:
    """Roles are checked before the write; the store checks the key once more as changed,
    inside the transaction, so a role widened in between cannot slip through: a refusal
    there rolls the whole change back."""
    store = client.app[STORE]
    target = await create_creds(client, admin, {"name": "t", "roles": ["developer"]})
    before = await get_key(client, admin, target.id)
    seen: list[frozenset[str]] = []

    def refuse_the_changed_key(key: Any) -> None:
        seen.append(key.permissions)
        if len(seen) == 2:  # the key as changed
            raise Forbidden(STRONGER_KEY)

    change = KeyChange(name="renamed", role_ids=[QUERY_ROLE])
    with pytest.raises(Forbidden):
        await change_key(
            store, admin.organization_id, target.id, change, None, refuse_the_changed_key
        )
    assert seen == [frozenset({"keys:read", "roles:read"}), frozenset({"endpoints:query"})]
    assert _unused(await get_key(client, admin, target.id)) == _unused(before)


async def test_a_create_is_checked_again_when_it_commits(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A role widened by another write after the create checked it, and before the create
    commits, is caught in the create's transaction: no key, no credentials."""
    store = client.app[STORE]
    creator, _ = await role_key(client, admin, ["keys:create", "keys:read", "reports:read"])
    role = await create_role(client, admin, {"name": "r", "permissions": ["reports:read"]})
    checked = type(store.roles).resolve_roles

    async def widened_after_the_check(self: Any, *args: Any) -> Any:
        roles = await checked(self, *args)
        await change_role(store, admin.organization_id, role["id"], utcnow(), permissions=["*"])
        return roles

    monkeypatch.setattr(type(store.roles), "resolve_roles", widened_after_the_check)
    response = await client.post(
        keys_url(admin),
        json={"name": "x", "assignedRoleIds": [role["id"]]},
        headers=creator.headers,
    )
    await assert_error(response, 403, "cannot grant role r: this key lacks the permission *")
    monkeypatch.undo()
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    assert {key["id"] for key in listed} == {admin.id, creator.id}
