"""A deleted key's credentials used: refused exactly as an unknown key ID is (answer,
metrics reason), yet, when the secret is the deleted key's own, logged as a
``key_used_after_revoke`` activity and sent as a ``key.used_after_revoke`` event, at
most once a minute per key, off the request's path. The tombstone that makes this
possible (``deleted_credentials``) is left by any delete, by hand included, and
pruned after the usage retention."""

import asyncio
from collections.abc import Callable
from typing import Any

from keysvc.config import Settings
from keysvc.credentials import new_key_id, new_secret
from tests.api.activities import listed
from tests.api.refusals import invalid_credentials, refusal
from tests.api.rotation import rotate
from tests.api.webhooks import create_webhook, private_client
from tests.handsql import audit_verdict, hand_sql
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    bootstrap,
    client_with,
    create_creds,
)
from tests.receiver import Receiver, signature_valid

AGENT = "deleted-key-client/1.0"


async def delete(client: Client, admin: Creds, key: Creds) -> None:
    path = f"/v1/organizations/{admin.organization_id}/keys/{key.id}"
    await assert_ok(await client.delete(path, headers=admin.headers))


async def uses(client: Client, admin: Creds) -> list[dict[str, Any]]:
    return [a for a in await listed(client, admin) if a["type"] == "key_used_after_revoke"]


async def uses_until(
    client: Client, admin: Creds, done: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The uses recorded, once ``done`` holds for them (written off the request's path)."""
    for _ in range(400):
        found = await uses(client, admin)
        if done(found):
            return found
        await asyncio.sleep(0.05)
    return await uses(client, admin)


def tombstones(settings: Settings) -> list[tuple[Any, ...]]:
    """(key UUID, key-ID hash length, secret hash length, deleted_at) of each tombstone."""
    return hand_sql(
        settings,
        "select key_id, length(key_id_hash), length(secret_hash), deleted_at"
        " from deleted_credentials order by key_id, deleted_at",
    )


def stored_bytes(settings: Settings) -> bytes:
    """Every byte of the tombstone table's values, to look for plain credentials in."""
    rows = hand_sql(settings, "select * from deleted_credentials")
    return b"".join(v if isinstance(v, bytes) else str(v).encode() for row in rows for v in row)


async def test_a_deleted_keys_use_answers_as_unknown_and_is_logged_once_a_minute(
    client: Client, admin: Creds, settings: Settings, clock: FakeClock
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    await delete(client, admin, dev)
    unknown = Creds(dev.organization_id, dev.id, new_key_id(), new_secret())
    before = await invalid_credentials(client)
    headers = {**dev.headers, "User-Agent": AGENT}
    for _ in range(10):
        assert (await client.get("/v1/whoami", headers=headers)).status == 401
    assert await refusal(client, dev) == await refusal(client, unknown)
    assert await invalid_credentials(client) == before + 12

    (use,) = await uses_until(client, admin, lambda found: len(found) >= 1)
    assert use["actorType"] == "api" and use["actorId"] == dev.id
    assert use["targetKeyId"] == dev.id
    assert use["after"] == {"state": "deleted"}
    assert use["actorIpAddress"] == "127.0.0.1" and use["userAgent"] == AGENT
    await asyncio.sleep(0.3)  # nothing more comes within the minute
    assert len(await uses(client, admin)) == 1

    clock.advance(minutes=1)
    assert (await client.get("/v1/whoami", headers=headers)).status == 401
    assert len(await uses_until(client, admin, lambda found: len(found) >= 2)) == 2
    # A wrong secret for the deleted key's ID is a failed authentication, no activity.
    clock.advance(minutes=1)
    wrong = Creds(dev.organization_id, dev.id, dev.key_id, new_secret())
    assert await refusal(client, wrong) == await refusal(client, unknown)
    await asyncio.sleep(0.3)
    assert len(await uses(client, admin)) == 2
    # The activities are chained like any other, and replay against the tables.
    assert audit_verdict(settings).problem is None
    stored = stored_bytes(settings)
    assert dev.key_id.encode() not in stored and dev.secret.encode() not in stored


async def test_a_deleted_keys_use_sends_its_event(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    hook = await create_webhook(
        client, admin, {"url": receiver.url, "events": ["key.used_after_revoke"]}
    )
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    await delete(client, admin, dev)
    for _ in range(3):  # one event for the minute, however many uses
        assert (await client.get("/v1/whoami", headers=dev.headers)).status == 401

    (got,) = await receiver.wait_for(lambda received: len(received) >= 1)
    await asyncio.sleep(0.3)  # nothing more comes
    assert len(receiver.received) == 1
    assert signature_valid(hook["secret"], got)
    assert got.event["type"] == "key.used_after_revoke"
    assert got.event["data"] == {"id": dev.id, "state": "deleted"}
    assert dev.key_id not in got.body.decode() and dev.secret not in got.body.decode()


async def test_a_hand_delete_leaves_tombstones_for_both_credentials_of_a_rotation(
    client: Client, admin: Creds, settings: Settings
) -> None:
    """Deleted by hand (in SQLite, in its shell, foreign keys off): the trigger keeps the key's
    credentials, and a rotation's previous ones while their grace runs."""
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    rotated, _ = await rotate(client, admin, dev, {"gracePeriodSeconds": 3600})
    hand_sql(settings, "delete from api_keys where id = ?", dev.id)
    assert [row[:3] for row in tombstones(settings)] == [(dev.id, 32, 32)] * 2

    unknown = Creds(dev.organization_id, dev.id, new_key_id(), new_secret())
    assert await refusal(client, dev) == await refusal(client, unknown)
    (use,) = await uses_until(client, admin, lambda found: len(found) >= 1)
    assert use["targetKeyId"] == dev.id and use["after"] == {"state": "deleted"}
    assert await refusal(client, rotated) == await refusal(client, unknown)
    stored = stored_bytes(settings)
    for plain in (dev.key_id, dev.secret, rotated.key_id, rotated.secret):
        assert plain.encode() not in stored


async def test_tombstones_past_the_retention_are_pruned(
    aiohttp_client: ClientFactory,
    client: Client,
    admin: Creds,
    settings: Settings,
    clock: FakeClock,
) -> None:
    old = await create_creds(client, admin, {"name": "old", "roles": ["developer"]})
    recent = await create_creds(client, admin, {"name": "recent", "roles": ["developer"]})
    await delete(client, admin, old)
    await delete(client, admin, recent)
    hand_sql(
        settings,
        "update deleted_credentials set deleted_at = '2000-01-01T00:00:00Z' where key_id = ?",
        old.id,
    )
    assert {row[0] for row in tombstones(settings)} == {old.id, recent.id}
    # Another serving process on the same database prunes as it starts.
    await client_with(aiohttp_client, settings, clock, usage_retention_days=30)
    for _ in range(400):
        if len(tombstones(settings)) < 2:
            break
        await asyncio.sleep(0.05)
    assert [row[0] for row in tombstones(settings)] == [recent.id]


async def test_a_deleted_keys_use_counts_as_a_failed_authentication(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    """Unlike a disabled key's: the throttle cannot tell it from an unknown key ID."""
    client = await client_with(aiohttp_client, settings, clock, auth_failures=2)
    admin = await bootstrap(client.app)
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    await delete(client, admin, dev)
    for _ in range(2):
        assert (await client.get("/v1/whoami", headers=dev.headers)).status == 401
    assert (await client.get("/v1/whoami", headers=admin.headers)).status == 429
