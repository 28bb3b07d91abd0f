"""Custom roles on keys through the real app: assignment at create and through actors,
the permissions a role grants, and actors that are refused."""

from tests.api.roles import (
    DEVELOPER_ROLE,
    QUERY_ROLE,
    actor,
    get_key,
    get_role,
    keys_url,
    role_key,
    roles_url,
)
from tests.helpers import (
    Client,
    Creds,
    assert_error,
    assert_ok,
    create,
    create_creds,
    create_role,
)

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
