"""Issue 36: a database from before identities, upgraded at start on both backends, gives
each (organization, externalId) that its keys carry an identity with no limits."""

import sqlite3

import asyncpg

from keysvc.config import Settings
from keysvc.db.sqlite.migrations import IDENTITIES_STEP, MIGRATIONS
from keysvc.http.app import create_app
from tests.helpers import Client, ClientFactory, Creds, FakeClock, assert_ok, bootstrap


async def _to_the_version_before(settings: Settings) -> None:
    """The database as the version before identities left it: no identities table (the
    steps after identities' run again at the upgrade, as each is written to)."""
    before = 1 + MIGRATIONS.index(IDENTITIES_STEP)
    if settings.db_url is None:
        raw = sqlite3.connect(settings.db_path)
        raw.executescript(f"drop table identities; pragma user_version = {before};")
        raw.close()
        return
    conn = await asyncpg.connect(settings.db_url)
    try:
        await conn.execute("drop table identities")
        await conn.execute("update meta set value = $1 where name = 'schema_version'", str(before))
    finally:
        await conn.close()


async def _identities(client: Client, creds: Creds) -> list[str]:
    url = f"/v1/organizations/{creds.organization_id}/identities"
    found = await assert_ok(await client.get(url, headers=creds.headers))
    assert all(i["credits"] is None and i["ratelimits"] == [] for i in found)
    return [i["externalId"] for i in found]


async def test_keys_with_an_external_id_get_identities_on_upgrade(
    client: Client,
    admin: Creds,
    settings: Settings,
    clock: FakeClock,
    aiohttp_client: ClientFactory,
) -> None:
    other = await bootstrap(client.app, "other")
    for creds, external_id in [(admin, "b"), (admin, "a"), (admin, "b"), (other, "a")]:
        body = {"name": "k", "roles": ["developer"], "externalId": external_id}
        url = f"/v1/organizations/{creds.organization_id}/keys"
        await assert_ok(await client.post(url, json=body, headers=creds.headers))
    await client.close()
    await _to_the_version_before(settings)
    upgraded = await aiohttp_client(create_app(settings, clock=clock))
    try:
        # In the order their first key was created.
        assert await _identities(upgraded, admin) == ["b", "a"]
        assert await _identities(upgraded, other) == ["a"]
        key = f"/v1/organizations/{admin.organization_id}/keys"
        page = await assert_ok(await upgraded.get(key, headers=admin.headers))
        first = await assert_ok(await upgraded.get(f"{key}/{page[1]['id']}", headers=admin.headers))
        assert first["externalId"] == "b" and "identityId" in first
    finally:
        await upgraded.close()
