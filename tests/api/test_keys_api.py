"""Create and read keys through the real app on a real SQLite file."""

import re

from keysvc.credentials import SECRET_PATTERN
from tests.helpers import (
    FAR_FUTURE,
    Client,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    bootstrap,
    create,
    create_creds,
    hash_data,
)

ADMIN_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001"
DEVELOPER_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
QUERY_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000003"
API_KEY_FIELDS = {
    "id", "name", "state", "roles", "assignedRoles", "keySuffix", "createdAt", "expireAt",
    "ipAccessList",
}  # fmt: skip
UTC_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z")


def path(creds: Creds, key: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/keys"
    return base if key is None else f"{base}/{key}"


async def test_create_defaults(client: Client, admin: Creds) -> None:
    result = await create(client, admin, {"name": "  ci deploy  ", "roles": ["developer"]})
    assert set(result) == {"key", "keyId", "keySecret"}
    key = result["key"]
    assert set(key) == API_KEY_FIELDS  # no usedAt until the key is used
    assert key["name"] == "ci deploy"
    assert key["state"] == "enabled"
    assert key["expireAt"] is None
    assert key["ipAccessList"] == []
    assert key["roles"] == ["developer"]
    assert key["assignedRoles"] == [
        {"roleId": DEVELOPER_ROLE, "roleName": "developer", "roleType": "system"}
    ]
    assert UTC_Z.fullmatch(key["createdAt"])
    assert re.fullmatch(r"[0-9A-Za-z]{20}", result["keyId"])
    assert re.fullmatch(SECRET_PATTERN, result["keySecret"])
    assert key["keySuffix"] == result["keyId"][-4:]


async def test_create_every_field_and_read_it_back(client: Client, admin: Creds) -> None:
    body = {
        "name": "reporting",
        "state": "disabled",
        "expireAt": "2099-06-01T12:00:00+02:00",
        "roles": ["developer"],
        "assignedRoleIds": [QUERY_ROLE, DEVELOPER_ROLE],
        "ipAccessList": [
            {"source": "10.0.0.0/8", "description": "office"},
            {"source": "2001:db8::/32"},
            {"source": "192.0.2.7"},
        ],
    }
    created = (await create(client, admin, body))["key"]
    assert created["state"] == "disabled"
    assert created["expireAt"] == "2099-06-01T10:00:00Z"
    assert created["ipAccessList"] == body["ipAccessList"]
    # The union of legacy names and role IDs, each once.
    assert {r["roleId"] for r in created["assignedRoles"]} == {DEVELOPER_ROLE, QUERY_ROLE}
    assert sorted(created["roles"]) == ["developer", "query_endpoints"]

    response = await client.get(path(admin, created["id"]), headers=admin.headers)
    read = await assert_ok(response)
    assert read == created
    assert "keySecret" not in read and "keyId" not in read


async def test_new_key_credentials_work(client: Client, admin: Creds) -> None:
    reader = await create_creds(client, admin, {"name": "reader", "roles": ["developer"]})
    response = await client.get(path(admin, admin.id), headers=reader.headers)
    assert (await assert_ok(response))["id"] == admin.id


async def test_used_at_set_on_first_use(client: Client, admin: Creds, clock: FakeClock) -> None:
    reader = await create_creds(client, admin, {"name": "reader", "roles": ["developer"]})
    before = await assert_ok(await client.get(path(admin, reader.id), headers=admin.headers))
    assert "usedAt" not in before
    await client.get(path(admin, admin.id), headers=reader.headers)
    after = await assert_ok(await client.get(path(admin, reader.id), headers=admin.headers))
    assert after["usedAt"] == clock.now.strftime("%Y-%m-%dT%H:%M:00Z")


async def test_hash_data_key_uses_the_clients_own_credentials(client: Client, admin: Creds) -> None:
    own_id, own_secret = "my-service-key-0001", "correct horse battery staple"
    body = {"name": "own", "roles": ["developer"], "hashData": hash_data(own_id, own_secret)}
    result = await create(client, admin, body)
    assert set(result) == {"key"}
    assert result["key"]["keySuffix"] == "0001"
    response = await client.get(path(admin, result["key"]["id"]), headers=basic(own_id, own_secret))
    assert (await assert_ok(response))["id"] == result["key"]["id"]
    wrong = await client.get(path(admin, admin.id), headers=basic(own_id, "wrong"))
    assert wrong.status == 401


async def test_duplicate_key_id_hash_is_conflict(client: Client, admin: Creds) -> None:
    dup = hash_data("dup-key-id", "s1")
    await create(client, admin, {"name": "first", "roles": ["admin"], "hashData": dup})
    response = await client.post(
        path(admin),
        json={"name": "second", "roles": ["admin"], "hashData": dup},
        headers=admin.headers,
    )
    await assert_error(response, 409, "hashData.keyIdHash: a key with this key ID already exists")


async def test_developer_reads_but_cannot_create(client: Client, admin: Creds) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    await assert_ok(await client.get(path(admin, admin.id), headers=dev.headers))
    response = await client.post(
        path(admin), json={"name": "x", "roles": ["admin"]}, headers=dev.headers
    )
    await assert_error(response, 403, "this key lacks the permission keys:create")


async def test_query_endpoints_has_no_management_access(client: Client, admin: Creds) -> None:
    query = await create_creds(client, admin, {"name": "q", "roles": ["query_endpoints"]})
    response = await client.get(path(admin, admin.id), headers=query.headers)
    await assert_error(response, 403, "this key lacks the permission keys:read")
    response = await client.post(
        path(admin), json={"name": "x", "roles": ["admin"]}, headers=query.headers
    )
    await assert_error(response, 403, "this key lacks the permission keys:create")


async def test_other_organization_is_forbidden(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    message = "this key does not belong to the organization in the path"
    response = await client.get(path(admin, admin.id), headers=other_admin.headers)
    await assert_error(response, 403, message)
    response = await client.post(
        path(admin), json={"name": "x", "roles": ["admin"]}, headers=other_admin.headers
    )
    await assert_error(response, 403, message)


async def test_key_of_another_organization_is_not_found(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    response = await client.get(path(admin, other_admin.id), headers=admin.headers)
    await assert_error(response, 404, "key not found in this organization")


async def test_unknown_key_is_not_found(client: Client, admin: Creds) -> None:
    missing = "00000000-0000-4000-8000-000000000000"
    await assert_error(
        await client.get(path(admin, missing), headers=admin.headers),
        404,
        "key not found in this organization",
    )


async def test_assigned_role_of_another_organization_is_rejected(
    client: Client, admin: Creds
) -> None:
    missing = "00000000-0000-4000-8000-000000000000"
    response = await client.post(
        path(admin), json={"name": "x", "assignedRoleIds": [missing]}, headers=admin.headers
    )
    await assert_error(response, 400, f"assignedRoleIds: no role {missing} in this organization")


async def test_key_needs_a_role(client: Client, admin: Creds) -> None:
    response = await client.post(path(admin), json={"name": "x"}, headers=admin.headers)
    await assert_error(
        response, 400, "roles: a key needs at least one role: give roles or assignedRoleIds"
    )


async def test_expire_at_normalised_and_null_or_empty_mean_never(
    client: Client, admin: Creds
) -> None:
    for value in (None, ""):
        key = (await create(client, admin, {"name": "n", "roles": ["admin"], "expireAt": value}))[
            "key"
        ]
        assert key["expireAt"] is None
    key = (await create(client, admin, {"name": "n", "roles": ["admin"], "expireAt": FAR_FUTURE}))[
        "key"
    ]
    assert key["expireAt"] == FAR_FUTURE


async def test_bootstrap_keys_are_independent_organizations(client: Client) -> None:
    first = await bootstrap(client.app, "one")
    second = await bootstrap(client.app, "two")
    assert first.organization_id != second.organization_id
    response = await client.get(path(first, first.id), headers=first.headers)
    assert (await assert_ok(response))["roles"] == ["admin"]
