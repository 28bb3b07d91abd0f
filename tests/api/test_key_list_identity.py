"""Issue 36: each key of the key list shows the ``identityId`` that GET of the key shows
(absent for a key without an identity), read with the page: a page of keys of many
identities runs the statements a page of one runs, never one more per key. Through the
real app on both backends."""

from typing import Any

import pytest

from keysvc.http.state import STORE
from tests.helpers import Client, Creds, assert_ok, count_reads, create, get_key, keys_url


async def _listed(client: Client, admin: Creds, query: str = "") -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = await assert_ok(
        await client.get(keys_url(admin) + query, headers=admin.headers)
    )
    return found


async def _made(client: Client, admin: Creds, name: str, external_id: str | None = None) -> str:
    body: dict[str, Any] = {"name": name, "roles": ["developer"]}
    if external_id is not None:
        body["externalId"] = external_id
    made: str = (await create(client, admin, body))["key"]["id"]
    return made


async def test_each_listed_key_shows_the_identity_get_shows(client: Client, admin: Creds) -> None:
    staging = await _made(client, admin, "staging", "cust_1")
    production = await _made(client, admin, "production", "cust_1")
    other = await _made(client, admin, "other", "cust_2")
    plain = await _made(client, admin, "plain")
    listed = {key["id"]: key for key in await _listed(client, admin)}
    for key_id in (staging, production, other, plain, admin.id):
        assert listed[key_id] == await get_key(client, admin, key_id)
    assert listed[staging]["identityId"] == listed[production]["identityId"]
    assert listed[other]["identityId"] not in (None, listed[staging]["identityId"])
    assert "identityId" not in listed[plain] and "identityId" not in listed[admin.id]
    # The ?externalId= filter's pages show it too.
    only = await _listed(client, admin, "?externalId=cust_1")
    assert [k.get("identityId") for k in only] == [listed[staging]["identityId"]] * 2


async def test_a_deleted_identity_leaves_its_keys_listed_without_one(
    client: Client, admin: Creds
) -> None:
    key_id = await _made(client, admin, "k", "cust_gone")
    identity = (await get_key(client, admin, key_id))["identityId"]
    url = f"/v1/organizations/{admin.organization_id}/identities/{identity}"
    await assert_ok(await client.delete(url, headers=admin.headers))
    [listed] = [k for k in await _listed(client, admin) if k["id"] == key_id]
    assert listed["externalId"] == "cust_gone" and "identityId" not in listed


async def test_a_page_reads_its_identities_in_its_own_statements(
    client: Client, admin: Creds, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = count_reads(client.app[STORE], monkeypatch)

    async def statements() -> list[str]:
        await _made(client, admin, "another")  # a commit: the next page is read afresh
        reads.clear()
        await _listed(client, admin)
        return list(reads)

    await _made(client, admin, "one", "cust_0")
    one = await statements()
    for number in range(1, 8):
        await _made(client, admin, f"key {number}", f"cust_{number}")
    many = await statements()
    assert len(many) == len(one), many
    listed = await _listed(client, admin)
    assert sum("identityId" in key for key in listed) == 8
