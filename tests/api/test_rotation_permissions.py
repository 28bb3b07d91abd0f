"""Who may rotate which key: rotating another key hands its new credentials to the
caller, so it needs keys:create as well as keys:update; a key rotates itself with
keys:update alone. Otherwise a key could escape the expiry, IP access list or rate
limit it may not lift on itself through a sibling's fresh credentials."""

from datetime import timedelta

from keysvc.domain.keys import ROTATE_OTHER_REFUSED
from tests.api.rotation import post_rotate, rotate, rotated_away, works
from tests.helpers import Client, Creds, FakeClock, assert_error, create_creds, create_role

# Authentication's answer to an expired key's credentials.
EXPIRED = "key has expired"


async def role_key(
    client: Client, admin: Creds, name: str, permissions: list[str], **fields: object
) -> tuple[str, Creds]:
    """A role ``name`` holding ``permissions``, and a key holding it (and ``fields``)."""
    role = await create_role(client, admin, {"name": name, "permissions": permissions})
    key = await create_creds(
        client, admin, {"name": "caller", "assignedRoleIds": [role["id"]], **fields}
    )
    return role["id"], key


async def test_keys_update_alone_does_not_mint_a_siblings_credentials(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    soon = (clock.now + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    role_id, caller = await role_key(client, admin, "updater", ["keys:update"], expireAt=soon)
    sibling = await create_creds(client, admin, {"name": "ci", "assignedRoleIds": [role_id]})
    await assert_error(await post_rotate(client, caller, sibling.id), 403, ROTATE_OTHER_REFUSED)
    # The sibling keeps its credentials, and the caller gets none that outlive it.
    assert await works(client, sibling)
    clock.advance(hours=2)
    await assert_error(await client.get("/v1/whoami", headers=caller.headers), 401, EXPIRED)
    assert await works(client, sibling)


async def test_the_refusal_names_no_key_it_may_not_see(client: Client, admin: Creds) -> None:
    """Refused before the key is looked up: an unknown key and a stronger one answer as
    a weaker one does."""
    _, caller = await role_key(client, admin, "reader", ["keys:update", "keys:read"])
    unknown = "00000000-0000-4000-8000-000000000000"
    for target in (unknown, admin.id):
        await assert_error(await post_rotate(client, caller, target), 403, ROTATE_OTHER_REFUSED)
    assert await works(client, admin)


async def test_keys_update_rotates_itself_and_keys_create_rotates_siblings(
    client: Client, admin: Creds
) -> None:
    _, alone = await role_key(client, admin, "updater", ["keys:update"])
    renewed, _ = await rotate(client, alone, alone)
    assert await works(client, renewed) and await rotated_away(client, alone)

    role_id, minter = await role_key(client, admin, "minter", ["keys:update", "keys:create"])
    sibling = await create_creds(client, admin, {"name": "ci", "assignedRoleIds": [role_id]})
    new, key = await rotate(client, minter, sibling)
    assert key["id"] == sibling.id
    assert await works(client, new) and await rotated_away(client, sibling)
    # keys:* and * cover keys:create.
    _, wide = await role_key(client, admin, "keyadmin", ["keys:*"])
    again, _ = await rotate(client, wide, new)
    assert await works(client, again)
