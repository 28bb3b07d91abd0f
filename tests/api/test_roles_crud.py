"""Custom roles through the real app: listing and shape, create, names, read, update
and delete, and system roles that never change."""

from typing import Any

import pytest

from keysvc.domain.roles import ROLE_NAME_TAKEN
from tests.api.roles import (
    ADMIN_ROLE,
    BAD_PERMISSION,
    DEVELOPER_ROLE,
    MISSING,
    NOT_FOUND,
    QUERY_ROLE,
    SYSTEM,
    SYSTEM_ROLES,
    actor,
    allow,
    check_role_shape,
    get_key,
    get_role,
    keys_url,
    roles_url,
)
from tests.helpers import (
    Client,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    create_creds,
    create_role,
)

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
