"""Issue 37's ``POST .../keys/import``, through the real app on both backends: records
checked as creates are, bad ones reported by index and the rest stored, importIds
making a repeated import quiet, the key limit counted, one activity a batch that the
audit replays, and each kind of material (hashData, a token hash, none)."""

import io
import secrets

import pytest

from keysvc.config import Settings
from tests.api.importing import import_keys, record
from tests.handsql import audit_verdict
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    bootstrap,
    client_with,
    create_creds,
    create_role,
    get_key,
    hash_data,
    keys_url,
)

# Token hashes go through the API here: KEYSVC_API_TOKEN_IMPORT on (off by default,
# tests/api/test_import_tokens_off.py).
pytestmark = pytest.mark.settings(api_token_import=True)


async def test_bad_records_are_reported_by_index_and_the_rest_go_in(
    client: Client, admin: Creds
) -> None:
    records = [
        record("a"),
        record("b", name=""),
        "not an object",
        record("c", roles=["nope"]),
        record("d", expireAt="2000-01-01T00:00:00Z"),
        {**record("e"), "hashData": hash_data("x" * 20, "y" * 20)},
        record("f", tokenHash={"algorithm": "md5", "encoding": "hex", "value": "00"}),
        {**record("g"), "surprise": 1},
        record("h"),
    ]
    result = await import_keys(client, admin, records)
    assert result["imported"] == 2
    assert [(k["index"], k["importId"]) for k in result["keys"]] == [(0, "a"), (8, "h")]
    errors = {e["index"]: (e["importId"], e["error"]) for e in result["errors"]}
    assert sorted(errors) == [1, 2, 3, 4, 5, 6, 7]
    assert errors[1][0] == "b" and errors[1][1].startswith("name:")
    assert errors[2] == (None, "must be a JSON object")
    assert errors[4][1] == "expireAt: must be in the future"
    assert errors[5][1] == "tokenHash: give hashData or tokenHash, not both"
    assert "tokenHash.algorithm: must be sha256" in errors[6][1]
    assert errors[7][1] == "surprise: is not a known field"
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    assert {k["name"] for k in listed} - {"acme admin"} == {"a", "h"}


async def test_importing_the_same_records_again_imports_nothing_twice(
    client: Client, admin: Creds
) -> None:
    records = [record(f"id-{n}") for n in range(5)]
    first = await import_keys(client, admin, records)
    assert (first["imported"], first["skipped"]) == (5, 0)
    again = await import_keys(client, admin, records)
    assert (again["imported"], again["skipped"], again["errors"]) == (0, 5, [])
    # A deleted key stays imported: a repeated import does not bring it back.
    gone = first["keys"][0]["id"]
    await assert_ok(await client.delete(keys_url(admin, gone), headers=admin.headers))
    third = await import_keys(client, admin, records)
    assert (third["imported"], third["skipped"]) == (0, 5)
    listed = await assert_ok(await client.get(keys_url(admin), headers=admin.headers))
    assert len(listed) == 1 + 4


async def test_a_batch_repeating_an_import_id_or_a_token_refuses_the_repeat(
    client: Client, admin: Creds
) -> None:
    token = secrets.token_urlsafe(24)
    records = [record("same", token=token), record("same"), record("other", token=token)]
    result = await import_keys(client, admin, records)
    assert result["imported"] == 1
    assert [e["index"] for e in result["errors"]] == [1, 2]
    # A token another key holds already is refused, as a create's taken key ID is.
    taken = await import_keys(client, admin, [record("later", token=token)])
    assert taken["errors"] == [
        {
            "index": 0,
            "importId": "later",
            "error": "tokenHash: a key with this token already exists",
        }
    ]


async def test_the_key_limit_counts_each_record(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, max_keys_per_org=3)
    admin = await bootstrap(client.app)
    result = await import_keys(client, admin, [record(f"k{n}") for n in range(4)])
    assert result["imported"] == 2
    refused = "this organization has reached its limit of 3 keys"
    assert [(e["index"], e["error"]) for e in result["errors"]] == [(2, refused), (3, refused)]


async def test_roles_the_caller_may_not_grant_are_refused(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "importer", "permissions": ["keys:create"]})
    importer = await create_creds(client, admin, {"name": "i", "assignedRoleIds": [role["id"]]})
    result = await import_keys(
        client, importer, [record("mine", roles=None, assignedRoleIds=[role["id"]]), record("up")]
    )
    assert result["imported"] == 1
    assert result["errors"][0]["index"] == 1
    assert "keys:read" in result["errors"][0]["error"]


async def test_hash_data_records_authenticate_with_their_key_id_and_secret(
    client: Client, admin: Creds
) -> None:
    key_id, secret = "legacy" + secrets.token_hex(8), "s3cret-" + secrets.token_hex(16)
    body = {"importId": "legacy-1", "name": "legacy", "roles": ["developer"]}
    result = await import_keys(client, admin, [{**body, "hashData": hash_data(key_id, secret)}])
    made = result["keys"][0]["id"]
    assert (await get_key(client, admin, made))["keySuffix"] == key_id[-4:]
    verified = await client.get("/v1/verify", headers=basic(key_id, secret))
    assert verified.headers["X-Key-Id"] == made


async def test_a_record_without_material_opens_with_nothing_until_rotated(
    client: Client, admin: Creds
) -> None:
    result = await import_keys(
        client, admin, [{"importId": "public", "name": "public", "roles": ["developer"]}]
    )
    made = result["keys"][0]["id"]
    rotated = await assert_ok(
        await client.post(keys_url(admin, made) + "/rotate", json={}, headers=admin.headers)
    )
    verified = await client.get("/v1/verify", headers=basic(rotated["keyId"], rotated["keySecret"]))
    assert verified.headers["X-Key-Id"] == made


async def test_one_activity_a_batch_with_its_count_which_the_audit_replays(
    client: Client, admin: Creds, settings: Settings
) -> None:
    role = await create_role(client, admin, {"name": "reports", "permissions": ["reports:read"]})
    records = [
        record("r1", expireAt="2999-01-01T00:00:00Z", ipAccessList=[{"source": "10.0.0.0/8"}]),
        record("r2", roles=["admin"], assignedRoleIds=[role["id"]], externalId="user-2"),
        record("r3", rateLimit={"limit": 5, "windowSeconds": 10}, credits={"remaining": 9}),
    ]
    await import_keys(client, admin, records)
    page = await assert_ok(
        await client.get(
            f"/v1/organizations/{admin.organization_id}/activities?include=keysvc",
            headers=admin.headers,
        )
    )
    imported = [a for a in page if a["type"] == "key_import"]
    assert len(imported) == 1
    assert imported[0]["after"]["count"] == 3
    assert imported[0]["actorId"] == admin.id
    assert audit_verdict(settings).problem is None


async def test_an_import_body_is_checked_whole_first(client: Client, admin: Creds) -> None:
    url = keys_url(admin) + "/import"
    too_many = {"keys": [record(str(n)) for n in range(1001)]}
    response = await client.post(url, json=too_many, headers=admin.headers)
    await assert_error(response, 400, "keys: must hold 1 to 1000 records")
    response = await client.post(url, json={"keys": []}, headers=admin.headers)
    await assert_error(response, 400, "keys: must hold 1 to 1000 records")
    response = await client.post(url, json={"records": []}, headers=admin.headers)
    assert response.status == 400
    huge = b'{"keys": ["' + b"x" * (9 * 1024 * 1024) + b'"]}'
    headers = {**admin.headers, "Content-Type": "application/json"}
    response = await client.post(url, data=io.BytesIO(huge), headers=headers)
    await assert_error(response, 413, "request body too large: an import's limit is 8388608 bytes")


async def test_imported_keys_belong_to_the_identity_of_their_external_id(
    client: Client, admin: Creds
) -> None:
    """Issue 36 on an import as on a create: an externalId with no identity yet gets
    one, shared by every key imported with it."""
    records = [record("a", externalId="cust"), record("b", externalId="cust"), record("c")]
    made = [key["id"] for key in (await import_keys(client, admin, records))["keys"]]
    url = f"/v1/organizations/{admin.organization_id}/identities"
    found = await assert_ok(
        await client.get(url, params={"externalId": "cust"}, headers=admin.headers)
    )
    assert len(found) == 1
    for key_id in made[:2]:
        assert (await get_key(client, admin, key_id))["identityId"] == found[0]["id"]
    assert "identityId" not in await get_key(client, admin, made[2])


async def test_a_record_that_is_not_an_object_is_reported_by_its_index(
    client: Client, admin: Creds
) -> None:
    result = await import_keys(client, admin, [None, record("fine"), [1, 2]])
    assert result["imported"] == 1
    assert [(e["index"], e["error"]) for e in result["errors"]] == [
        (0, "must be a JSON object"),
        (2, "must be a JSON object"),
    ]
