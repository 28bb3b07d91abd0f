"""The hostile review of issue 36's identities (rt/36), through the real app on both
backends: a key that may create or update keys, or write identities, cannot use an
externalId to reach an identity whose keys are stronger than it. Without these rules a
key holding only keys:create put a key of its own into an admin's identity and spent
its shared credits (the admin's key then got 429), and a key holding identities:write
made an identity with no credits over an admin's externalId once its identity had been
deleted."""

import hashlib
import secrets
from typing import Any

import pytest

from tests.helpers import (
    Client,
    Creds,
    assert_error,
    assert_ok,
    create_creds,
    create_role,
    keys_url,
)

# Token hashes go through the API here: KEYSVC_API_TOKEN_IMPORT on (off by default,
# tests/api/test_import_tokens_off.py).
pytestmark = pytest.mark.settings(api_token_import=True)

VERIFY = "/v1/verify"
JOINING = (
    "externalId: this organization's identity with this externalId shares credits or rate"
    " limits; putting a key into it needs identities:write and every permission its keys hold"
)
STRONGER = "cannot change this identity: one of its keys holds a permission this key lacks"


def _identities(creds: Creds, identity: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/identities"
    return base if identity is None else f"{base}/{identity}"


async def _weak(client: Client, admin: Creds, *permissions: str) -> tuple[Creds, str]:
    """A key of a custom role with only ``permissions``, and that role's ID."""
    role = await create_role(client, admin, {"name": "weak", "permissions": list(permissions)})
    weak = await create_creds(client, admin, {"name": "weak", "assignedRoleIds": [role["id"]]})
    return weak, role["id"]


async def _shared(client: Client, admin: Creds, external_id: str, **body: Any) -> dict[str, Any]:
    """An identity with 100 credits and an admin key in it."""
    response = await client.post(
        _identities(admin),
        json={"externalId": external_id, "credits": {"remaining": 100}, **body},
        headers=admin.headers,
    )
    identity: dict[str, Any] = await assert_ok(response)
    return identity


async def _remaining(client: Client, admin: Creds, identity_id: str) -> int:
    found = await assert_ok(
        await client.get(_identities(admin, identity_id), headers=admin.headers)
    )
    remaining: int = found["credits"]["remaining"]
    return remaining


async def test_a_key_that_may_create_keys_cannot_put_one_into_a_stronger_identity(
    client: Client, admin: Creds
) -> None:
    identity = await _shared(client, admin, "cust")
    strong = await create_creds(
        client, admin, {"name": "strong", "roles": ["admin"], "externalId": "cust"}
    )
    weak, role = await _weak(client, admin, "keys:create", "keys:read", "keys:update")
    body = {"name": "mine", "assignedRoleIds": [role], "externalId": "cust"}
    created = await client.post(keys_url(weak), json=body, headers=weak.headers)
    await assert_error(created, 403, JOINING)
    # Nor by a PATCH of a key it may change, nor by an import.
    mine = await create_creds(client, weak, {"name": "mine", "assignedRoleIds": [role]})
    patched = await client.patch(
        keys_url(weak, mine.id), json={"externalId": "cust"}, headers=weak.headers
    )
    await assert_error(patched, 403, JOINING)
    digest = hashlib.sha256(secrets.token_urlsafe(24).encode()).hexdigest()
    record = {
        "importId": "in", "name": "in", "assignedRoleIds": [role], "externalId": "cust",
        "tokenHash": {"algorithm": "sha256", "encoding": "hex", "value": digest},
    }  # fmt: skip
    imported = await assert_ok(
        await client.post(keys_url(weak) + "/import", json={"keys": [record]}, headers=weak.headers)
    )
    assert imported["keys"] == []
    assert [(e["index"], e["error"]) for e in imported["errors"]] == [(0, JOINING)]
    # The credits stay the identity's keys' own.
    assert await _remaining(client, admin, identity["id"]) == 100
    assert (await client.get(VERIFY, headers=strong.headers)).status == 200


async def test_a_key_that_may_change_the_identity_still_puts_keys_into_it(
    client: Client, admin: Creds
) -> None:
    identity = await _shared(client, admin, "team")
    await create_creds(client, admin, {"name": "dev", "roles": ["developer"], "externalId": "team"})
    joined = await create_creds(
        client, admin, {"name": "dev", "roles": ["developer"], "externalId": "team"}
    )
    spent = await client.get(VERIFY, headers={**joined.headers, "X-Credit-Cost": "7"})
    assert spent.headers["X-Credits-Identity-Remaining"] == "93"
    assert await _remaining(client, admin, identity["id"]) == 93
    # An identity that shares nothing is joined as before, by any key that makes keys.
    weak, role = await _weak(client, admin, "keys:create", "keys:read")
    plain = await client.post(
        _identities(admin), json={"externalId": "plain"}, headers=admin.headers
    )
    await assert_ok(plain)
    body = {"name": "mine", "assignedRoleIds": [role], "externalId": "plain"}
    await assert_ok(await client.post(keys_url(weak), json=body, headers=weak.headers))


async def test_an_identity_made_again_over_stronger_keys_needs_their_permissions(
    client: Client, admin: Creds
) -> None:
    strong = await create_creds(
        client, admin, {"name": "strong", "roles": ["admin"], "externalId": "big"}
    )
    found = await assert_ok(
        await client.get(_identities(admin) + "?externalId=big", headers=admin.headers)
    )
    await assert_ok(await client.delete(_identities(admin, found[0]["id"]), headers=admin.headers))
    writer, _ = await _weak(client, admin, "identities:write", "identities:read")
    body = {"externalId": "big", "credits": {"remaining": 0}}
    made = await client.post(_identities(writer), json=body, headers=writer.headers)
    await assert_error(made, 403, STRONGER)
    assert (await client.get(VERIFY, headers=strong.headers)).status == 200
    # The admin itself may.
    await assert_ok(await client.post(_identities(admin), json=body, headers=admin.headers))
    locked = await client.get(VERIFY, headers=strong.headers)
    assert locked.status == 429
