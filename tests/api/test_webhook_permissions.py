"""What a webhook's permissions reach: a subscription to key events sends every key's
public view, so creating one needs keys:read besides webhooks:write; listing webhooks
and their deliveries shows no event body, so webhooks:read is enough there."""

from keysvc.config import Settings
from keysvc.domain.webhooks import KEY_EVENTS_REFUSED
from tests.api.webhooks import ALL_EVENTS, attempted, create_webhook, hooks_url, private_client
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    create,
    create_creds,
    create_role,
)
from tests.receiver import Receiver

PUBLIC = "http://192.0.2.1/"  # a literal: no name to resolve
# What a delivery shows: its event's type and ID and the attempts, never the body.
DELIVERY_FIELDS = {
    "id", "eventId", "eventType", "createdAt", "state", "attemptCount", "attempts",
    "nextAttemptAt",
}  # fmt: skip


async def holder(client: Client, admin: Creds, name: str, permissions: list[str]) -> Creds:
    """A key holding a role ``name`` of ``permissions``."""
    role = await create_role(client, admin, {"name": name, "permissions": permissions})
    return await create_creds(client, admin, {"name": name, "assignedRoleIds": [role["id"]]})


async def test_webhooks_write_alone_cannot_subscribe_to_key_events(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    hooker = await holder(client, admin, "hooks", ["webhooks:write", "webhooks:read"])
    refused = await client.get(
        f"/v1/organizations/{admin.organization_id}/keys", headers=hooker.headers
    )
    await assert_error(refused, 403, "this key lacks the permission keys:read")
    for event in ALL_EVENTS:
        response = await client.post(
            hooks_url(hooker), json={"url": PUBLIC, "events": [event]}, headers=hooker.headers
        )
        await assert_error(response, 403, KEY_EVENTS_REFUSED)
    assert await assert_ok(await client.get(hooks_url(admin), headers=admin.headers)) == []


async def test_webhooks_write_with_keys_read_subscribes(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    both = await holder(client, admin, "hooks", ["webhooks:write", "keys:read"])
    created = await create_webhook(client, both, {"url": PUBLIC, "events": ALL_EVENTS})
    assert created["webhook"]["events"] == ALL_EVENTS
    # keys:* covers keys:read.
    wide = await holder(client, admin, "keyhooks", ["webhooks:write", "keys:*"])
    await create_webhook(client, wide, {"url": PUBLIC, "events": ["key.created"]})


async def test_webhooks_read_shows_no_key_data(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    """A reader of webhooks, refused keys, sees deliveries without their events' data."""
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    webhook = (
        await create_webhook(client, admin, {"url": receiver.url, "events": ["key.created"]})
    )["webhook"]
    reader = await holder(client, admin, "hookreader", ["webhooks:read"])
    made = await create(client, admin, {"name": "payroll-export-7f3a", "roles": ["developer"]})
    # Two key.created deliveries, the reader's and this key's, attempted.
    await attempted(client, admin, webhook["id"], count=2)
    for url in (
        hooks_url(reader),
        hooks_url(reader, webhook["id"]),
        hooks_url(reader, webhook["id"], "/deliveries"),
    ):
        response = await client.get(url, headers=reader.headers)
        await assert_ok(response)
        text = await response.text()
        assert "payroll-export-7f3a" not in text and made["key"]["id"] not in text
    log = await assert_ok(
        await client.get(hooks_url(reader, webhook["id"], "/deliveries"), headers=reader.headers)
    )
    assert all(set(delivery) == DELIVERY_FIELDS for delivery in log)
