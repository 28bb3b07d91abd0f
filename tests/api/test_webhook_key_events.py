"""The key events that other writes send: a rotation's ``key.rotated`` in its
transaction, and ``key.used_after_revoke`` for a disabled key's valid credentials,
at most once a minute per key, with its activity. Delivered to a real receiver on a
loopback port, signatures checked apart from keysvc's code."""

import asyncio

from keysvc.config import Settings
from tests.api.webhooks import create_webhook, private_client
from tests.helpers import (
    ClientFactory,
    FakeClock,
    assert_ok,
    basic,
    bootstrap,
    create,
)
from tests.receiver import Receiver, signature_valid


async def test_a_rotation_and_a_revoked_keys_use_send_their_events(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    events = ["key.rotated", "key.used_after_revoke"]
    hook = await create_webhook(client, admin, {"url": receiver.url, "events": events})
    made = await create(client, admin, {"name": "ci", "roles": ["developer"]})
    key_url = f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"
    rotated = await assert_ok(
        await client.post(
            f"{key_url}/rotate", json={"gracePeriodSeconds": 60}, headers=admin.headers
        )
    )
    await assert_ok(await client.patch(key_url, json={"state": "disabled"}, headers=admin.headers))
    disabled = basic(rotated["keyId"], rotated["keySecret"])
    for _ in range(3):  # one event for the minute, however many uses
        assert (await client.get("/v1/whoami", headers=disabled)).status == 401

    received = await receiver.wait_for(lambda got: len(got) >= 2)
    await asyncio.sleep(0.3)  # nothing more comes
    assert [r.event["type"] for r in receiver.received] == events
    for request in received:
        assert signature_valid(hook["secret"], request)
        assert request.event["data"]["id"] == made["key"]["id"]
        assert rotated["keySecret"] not in request.body.decode()
        assert rotated["keyId"] not in request.body.decode()
    rotation, use = (r.event["data"] for r in received)
    assert rotation["keySuffix"] == rotated["keyId"][-4:]
    assert "previousCredentialExpiresAt" in rotation
    assert use["state"] == "disabled"
