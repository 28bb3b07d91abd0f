"""key.expiring through the real app: each webhook warns of a key its expiringDays
before the key's expireAt, once per key, expiry date and webhook, whichever scan sees
it; a changed expireAt warns again; disabled keys and keys already expired never."""

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from keysvc.config import Settings
from keysvc.timeutil import to_text
from tests.api.webhooks import create_webhook, private_client
from tests.helpers import ClientFactory, FakeClock, assert_ok, bootstrap, create
from tests.receiver import Receiver, signature_valid

SCANS = 0.1  # seconds between scans in these tests


@pytest.fixture
async def receivers() -> AsyncIterator[tuple[Receiver, Receiver]]:
    pair = (await Receiver().start(), await Receiver().start())
    yield pair
    for receiver in pair:
        await receiver.stop()


async def test_each_webhook_warns_once_its_days_before_expiry(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receivers: tuple[Receiver, Receiver],
) -> None:
    week, day = receivers
    client = await private_client(aiohttp_client, settings, clock, webhook_expiry_scan=SCANS)
    admin = await bootstrap(client.app)
    weekly = await create_webhook(client, admin, {"url": week.url, "events": ["key.expiring"]})
    await create_webhook(
        client, admin, {"url": day.url, "events": ["key.expiring"], "expiringDays": 1}
    )
    expire_at = clock.now + timedelta(days=10)
    made = await create(
        client, admin, {"name": "soon", "roles": ["developer"], "expireAt": to_text(expire_at)}
    )
    never = {"name": "never", "roles": ["developer"]}
    await create(client, admin, never)
    await create(
        client,
        admin,
        {**never, "state": "disabled", "expireAt": to_text(clock.now + timedelta(days=2))},
    )
    await asyncio.sleep(10 * SCANS)
    assert week.received == [] and day.received == []  # ten days ahead: too early for both

    clock.advance(days=4)  # six days left: the weekly webhook warns
    (warned,) = await week.wait_for(lambda got: len(got) >= 1)
    assert warned.event["type"] == "key.expiring"
    assert warned.event["data"]["id"] == made["key"]["id"]
    assert warned.event["data"]["expireAt"] == to_text(expire_at)
    assert signature_valid(weekly["secret"], warned)
    await asyncio.sleep(10 * SCANS)  # many scans later, still once
    assert len(week.received) == 1 and day.received == []

    clock.advance(days=5, hours=12)  # half a day left: the daily one too, the weekly not again
    await day.wait_for(lambda got: len(got) >= 1)
    await asyncio.sleep(10 * SCANS)
    assert len(week.received) == 1 and len(day.received) == 1

    # A new expiry date is a new warning.
    key_url = f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"
    later = clock.now + timedelta(days=3)
    response = await client.patch(key_url, json={"expireAt": to_text(later)}, headers=admin.headers)
    await assert_ok(response)
    again = await week.wait_for(lambda got: len(got) >= 2)
    assert again[1].event["data"]["expireAt"] == to_text(later)
    assert again[1].event["id"] != again[0].event["id"]
    await asyncio.sleep(10 * SCANS)
    assert len(week.received) == 2 and len(day.received) == 1

    clock.advance(days=4)  # expired: nothing more
    await asyncio.sleep(10 * SCANS)
    assert len(week.received) == 2 and len(day.received) == 1
