"""``keysvc audit verify``'s cross-check of the live tables against the log
(``keysvc.db.replay``), on the database an app wrote through the API: every kind of
key and role write replays to what the tables hold, and a key or role changed in the
tables behind the log's back is named."""

import os
from typing import Any

import pytest

from keysvc.config import Settings
from tests.api.rotation import rotate
from tests.handsql import audit_verdict, hand_sql, hand_transaction
from tests.helpers import (
    FAR_FUTURE,
    Client,
    Creds,
    assert_ok,
    create_creds,
    create_role,
)

ADMIN_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001"


def problem(settings: Settings) -> str | None:
    return audit_verdict(settings).problem


async def every_kind_of_write(client: Client, admin: Creds) -> dict[str, Any]:
    """Keys and roles made, changed, rotated, moved and deleted through the API."""
    org = f"/v1/organizations/{admin.organization_id}"
    one = await create_creds(client, admin, {"name": "one", "roles": ["developer"]})
    two = await create_creds(client, admin, {"name": "two", "roles": ["developer"]})
    gone = await create_creds(client, admin, {"name": "gone", "roles": ["developer"]})
    body: dict[str, Any] = {
        "name": "k2",
        "state": "disabled",
        "expireAt": FAR_FUTURE,
        "ipAccessList": [{"source": "10.0.0.0/8", "description": "office"}],
        "roles": ["query_endpoints", "developer"],
        "rateLimit": {"limit": 5, "windowSeconds": 10},
    }
    await assert_ok(await client.patch(f"{org}/keys/{one.id}", json=body, headers=admin.headers))
    await rotate(client, admin, two)
    role = await create_role(
        client,
        admin,
        {"name": "r", "permissions": ["reports:read"], "actors": [f"apiKey/{one.id}"]},
    )
    kept = await create_role(client, admin, {"name": "kept", "permissions": ["reports:read"]})
    moved = {"actors": [f"apiKey/{two.id}"], "permissions": ["reports:read", "keys:read"]}
    await assert_ok(
        await client.patch(f"{org}/roles/{role['id']}", json=moved, headers=admin.headers)
    )
    renamed = {"name": "kept2"}
    await assert_ok(
        await client.patch(f"{org}/roles/{kept['id']}", json=renamed, headers=admin.headers)
    )
    back = {"actors": []}
    await assert_ok(
        await client.patch(f"{org}/roles/{role['id']}", json=back, headers=admin.headers)
    )
    await assert_ok(await client.delete(f"{org}/roles/{role['id']}", headers=admin.headers))
    await assert_ok(await client.delete(f"{org}/keys/{gone.id}", headers=admin.headers))
    return {"one": one, "two": two, "kept": kept["id"]}


async def test_every_kind_of_write_replays_to_the_tables(
    client: Client, admin: Creds, other_admin: Creds, settings: Settings
) -> None:
    await every_kind_of_write(client, admin)
    await every_kind_of_write(client, other_admin)
    assert problem(settings) is None


def _new_admin_key(settings: Settings, made: dict[str, Any]) -> tuple[str, str]:
    """A key inserted straight into the tables: a copy of one's row under a new UUID,
    with the admin role."""
    key_id = "11111111-2222-4333-8444-555555555555"
    hand_transaction(
        settings,
        (
            "insert into api_keys (id, organization_id, name, state, key_id_hash, secret_hash,"
            " key_suffix, created_at, org_seq) select ?, organization_id, 'x', 'enabled',"
            " ?, secret_hash, 'abcd', created_at, 999 from api_keys where id = ?",
            (key_id, os.urandom(32), made["one"].id),
        ),
        ("insert into key_roles (key_id, role_id) values (?, ?)", (key_id, ADMIN_ROLE)),
    )
    return key_id, f"key {key_id} has no key_create record in its organization"


def _role_added(settings: Settings, made: dict[str, Any]) -> tuple[str, str]:
    role_id = "66666666-7777-4888-8999-000000000000"
    hand_sql(
        settings,
        "insert into roles (id, organization_id, name, type, permissions, created_at, updated_at)"
        " select ?, organization_id, 'sneaky', 'custom', '[\"*\"]', created_at, updated_at"
        " from roles where id = ?",
        role_id,
        made["kept"],
    )
    return role_id, f"role {role_id} has no role_create record in its organization"


# One statement on the tables each, the target it names ("one": the key changed by a
# PATCH, "two": the rotated key, "kept": the renamed role), and what verify says.
EDITS = [
    ("update api_keys set state = 'enabled' where id = ?", "one", "key {}: state differs"),
    ("update api_keys set expire_at = null where id = ?", "one", "key {}: expireAt differs"),
    ("update api_keys set ip_access_list = '[]' where id = ?", "one", "key {}: ipAccessList"),
    ("update api_keys set rate_limit = null, rate_window = null where id = ?", "one",
     "key {}: rateLimit differs"),
    (f"insert into key_roles (key_id, role_id) values (?, '{ADMIN_ROLE}')", "two",
     "key {}: assignedRoles differs"),
    ("update api_keys set key_suffix = 'zzzz' where id = ?", "two", "key {}: keySuffix differs"),
    ("delete from api_keys where id = ?", "two", "key {} is gone without a key_delete record"),
    ("update roles set permissions = '[\"*\"]' where id = ?", "kept",
     "role {}: permissions differs from its last recorded value"),
    ("update roles set name = 'admin2' where id = ?", "kept", "role {}: name differs"),
]  # fmt: skip


def _edit(statement: str, target: str, message: str) -> Any:
    def tamper(settings: Settings, made: dict[str, Any]) -> tuple[str, str]:
        found = made[target] if target == "kept" else made[target].id
        hand_sql(settings, statement, found)
        return found, message.format(found)

    return tamper


@pytest.mark.parametrize(
    "tamper",
    [_new_admin_key, _role_added, *(_edit(*edit) for edit in EDITS)],
)
async def test_a_change_behind_the_logs_back_is_named(
    client: Client, admin: Creds, settings: Settings, tamper: Any
) -> None:
    made = await every_kind_of_write(client, admin)
    assert problem(settings) is None
    _, named = tamper(settings, made)
    found = problem(settings)
    assert found is not None and found.startswith(named), found
