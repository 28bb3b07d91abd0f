"""No privilege escalation against stronger keys and roles: a key changes no key or role
stronger than itself, lifts none of its own restrictions, and every change is checked
again as it commits."""

import uuid
from typing import Any

import pytest

from keysvc.domain.keys import STRONGER_KEY, change_key
from keysvc.domain.roles import OWN_ROLES, STRONGER_ACTOR, STRONGER_ROLE, change_role
from keysvc.errors import Forbidden
from keysvc.http.state import STORE
from keysvc.models import KeyChange
from keysvc.timeutil import utcnow
from tests.api.roles import (
    ADMIN_ROLE,
    DEVELOPER_ROLE,
    MANAGER,
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
