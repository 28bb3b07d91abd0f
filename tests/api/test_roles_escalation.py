"""No privilege escalation through roles: a key writes only roles within its own
permissions, and grants only what it holds (system roles and wildcards included)."""

from typing import Any

import pytest

from keysvc.domain.roles import STRONGER_ROLE
from tests.api.roles import (
    ADMIN_ROLE,
    MANAGER,
    NEEDS_KEYS_UPDATE,
    actor,
    allow,
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
    create_creds,
    create_role,
)

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
