"""A rotation's previous credentials once their grace has ended: a serving process's
upkeep (at start, then every few minutes) moves their hashes off the key, so the key no
longer shows previousCredentialExpiresAt, into a tombstone, so that the old pair is still
answered as rotated."""

import asyncio
from datetime import UTC, datetime

from keysvc.config import Settings
from keysvc.timeutil import from_text
from tests.api.rotation import rotate, rotated_away, works
from tests.handsql import hand_sql
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    client_with,
    create_creds,
)

PREVIOUS = """
    select previous_key_id_hash, previous_secret_hash, previous_until from api_keys where id = ?
"""
GENERATION = "select cast(value as integer) from meta where name = 'auth_generation'"


def read(settings: Settings, sql: str, *params: str) -> tuple[object, ...]:
    (row,) = hand_sql(settings, sql, *params)
    return row


async def test_ended_previous_credentials_are_dropped(
    client: Client,
    admin: Creds,
    clock: FakeClock,
    settings: Settings,
    aiohttp_client: ClientFactory,
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    kept = await create_creds(client, admin, {"name": "kept", "roles": ["developer"]})
    new, rotated = await rotate(client, admin, svc, {"gracePeriodSeconds": 1})
    # Another key still in its grace keeps its previous credentials.
    _, still = await rotate(client, admin, kept, {"gracePeriodSeconds": 3600})
    end = from_text(rotated["previousCredentialExpiresAt"])
    # The upkeep reads the real clock: wait until the grace has ended by it too.
    await asyncio.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()) + 0.1)
    clock.now = datetime.now(UTC)
    assert await rotated_away(client, svc)
    generation = read(settings, GENERATION)[0]

    # Another serving process on the same database tidies as it starts.
    await client_with(aiohttp_client, settings, clock)
    for _ in range(600):
        if read(settings, PREVIOUS, svc.id) == (None, None, None):
            break
        await asyncio.sleep(0.05)
    assert read(settings, PREVIOUS, svc.id) == (None, None, None)
    assert read(settings, GENERATION)[0] != generation  # every process drops its caches

    url = f"/v1/organizations/{admin.organization_id}/keys"
    shown = await assert_ok(await client.get(f"{url}/{svc.id}", headers=admin.headers))
    assert "previousCredentialExpiresAt" not in shown
    assert shown["keySuffix"] == new.key_id[-4:]
    # Kept as a tombstone: still answered as rotated, not counted as a failed login.
    assert await rotated_away(client, svc) and await works(client, new)
    other = await assert_ok(await client.get(f"{url}/{kept.id}", headers=admin.headers))
    assert other["previousCredentialExpiresAt"] == still["previousCredentialExpiresAt"]
    assert await works(client, kept)
