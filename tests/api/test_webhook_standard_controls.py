"""Delivery controls, through the real app and its delivery task to real loopback
receivers, on the app's (fake) clock: a manual retry of one delivery (again its
event, body and webhook-id, newly signed; one attempt more for a failed one; recorded
as a ``webhook_delivery_retry`` activity) and its refusals (recording nothing); a
webhook that fails every attempt for KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS is disabled,
its organization's other webhooks are sent ``webhook.disabled`` (verified with the
``standardwebhooks`` package) and an activity is recorded; a disabled webhook is sent
nothing; PATCH ``enabled: true`` enables it again with its failure clock reset."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from standardwebhooks import Webhook

from keysvc.config import Settings
from keysvc.timeutil import to_text
from tests.api.webhooks import (
    attempted,
    create_webhook,
    deliveries,
    every_activity,
    hooked,
    hooks_url,
)
from tests.handsql import audit_verdict
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

CREATED = ["key.created"]
NOT_FOUND = "webhook not found in this organization"
DELIVERY_NOT_FOUND = "delivery not found for this webhook"
DISABLED = "this webhook is disabled: enable it first (PATCH it with enabled: true), then retry"


@pytest.fixture
async def watcher() -> AsyncIterator[Receiver]:
    """A second receiver: the organization's other webhook."""
    started = await Receiver().start()
    yield started
    await started.stop()


def retry_url(caller: Creds, webhook_id: str, delivery_id: str) -> str:
    return hooks_url(caller, webhook_id, f"/deliveries/{delivery_id}/retry")


async def retry(client: Client, caller: Creds, webhook_id: str, delivery_id: str) -> Any:
    response = await client.post(retry_url(caller, webhook_id, delivery_id), headers=caller.headers)
    return await assert_ok(response)


async def webhook_of(client: Client, caller: Creds, webhook_id: str) -> dict[str, Any]:
    response = await client.get(hooks_url(caller, webhook_id), headers=caller.headers)
    result: dict[str, Any] = await assert_ok(response)
    return result


async def test_a_delivery_is_sent_again_on_demand(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    backend: str,
) -> None:
    client, admin, webhook_id, secret = await hooked(
        aiohttp_client, settings, clock, receiver, CREATED
    )
    await create(client, admin, {"name": "k", "roles": ["developer"]})
    (entry,) = await attempted(client, admin, webhook_id)
    assert entry["state"] == "delivered"
    again = await retry(client, admin, webhook_id, entry["id"])
    assert (again["id"], again["eventId"], again["state"]) == (entry["id"], entry["eventId"],
                                                             "pending")  # fmt: skip
    first, second = await receiver.wait_for(lambda got: len(got) >= 2)
    assert second.body == first.body
    assert second.headers["webhook-id"] == first.headers["webhook-id"] == entry["eventId"]
    assert Webhook(secret).verify(second.body, second.headers) == first.event
    (entry,) = await attempted(client, admin, webhook_id, attempts=2)
    assert (entry["state"], entry["attemptCount"]) == ("delivered", 2)
    # The redelivery is recorded: who asked, which delivery of which webhook.
    (record,) = [a for a in await every_activity(client, admin)
                 if a["type"] == "webhook_delivery_retry"]  # fmt: skip
    assert (record["actorType"], record["actorId"]) == ("api", admin.id)
    assert record["after"] == {
        "webhookId": webhook_id, "url": receiver.url, "deliveryId": entry["id"],
        "eventType": "key.created",
    }  # fmt: skip
    assert "before" not in record and secret not in repr(record)
    assert audit_verdict(settings).problem is None


async def test_a_failed_delivery_gets_one_attempt_more(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    backend: str,
) -> None:
    client, admin, webhook_id, _ = await hooked(aiohttp_client, settings, clock, receiver, CREATED)
    receiver.status = 500
    await create(client, admin, {"name": "k", "roles": ["developer"]})
    await attempted(client, admin, webhook_id)
    clock.advance(days=1, seconds=1)  # its retry is due, and past its day: failed after it
    (entry,) = await attempted(client, admin, webhook_id, attempts=2)
    assert entry["state"] == "failed" and entry["nextAttemptAt"] is None

    await retry(client, admin, webhook_id, entry["id"])
    (entry,) = await attempted(client, admin, webhook_id, attempts=3)
    assert entry["state"] == "failed"  # one attempt, failed again, and no retry after it
    receiver.status = 204
    await retry(client, admin, webhook_id, entry["id"])
    (entry,) = await attempted(client, admin, webhook_id, attempts=4)
    assert entry["state"] == "delivered"
    assert [a["status"] for a in entry["attempts"]] == [500, 500, 500, 204]
    assert len(receiver.received) == 4


async def test_a_retry_is_refused_outside_its_webhook(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    backend: str,
) -> None:
    client, admin, first, _ = await hooked(aiohttp_client, settings, clock, receiver, CREATED)
    other_admin = await bootstrap(client.app, "other")
    body = {"url": receiver.url, "events": ["key.deleted"]}
    second = (await create_webhook(client, admin, body))["webhook"]["id"]
    await create(client, admin, {"name": "k", "roles": ["developer"]})
    (delivery,) = await attempted(client, admin, first)
    assert delivery["state"] == "delivered"
    missing = "00000000-0000-4000-8000-000000000000"
    for webhook_id, delivery_id, message in (
        (first, missing, DELIVERY_NOT_FOUND),
        (second, delivery["id"], DELIVERY_NOT_FOUND),  # the organization's other webhook
        (missing, delivery["id"], NOT_FOUND),
    ):
        response = await client.post(
            retry_url(admin, webhook_id, delivery_id), headers=admin.headers
        )
        await assert_error(response, 404, message)
    elsewhere = retry_url(other_admin, first, delivery["id"])
    await assert_error(await client.post(elsewhere, headers=other_admin.headers), 404, NOT_FOUND)
    response = await client.post(retry_url(admin, first, "x"), headers=admin.headers)
    assert response.status == 400
    role = await create_role(client, admin, {"name": "r", "permissions": ["webhooks:read"]})
    reader = await create_creds(client, admin, {"name": "r", "assignedRoleIds": [role["id"]]})
    await attempted(client, admin, first, count=2)  # the reader's key.created
    response = await client.post(retry_url(admin, first, delivery["id"]), headers=reader.headers)
    await assert_error(response, 403, "this key lacks the permission webhooks:write")
    await asyncio.sleep(0.3)
    after = await deliveries(client, admin, first)
    assert after[-1] == delivery  # unchanged: not sent again
    assert len(receiver.received) == 2
    log = await every_activity(client, admin)
    assert not [a for a in log if a["type"] == "webhook_delivery_retry"]  # refused: none


async def test_a_webhook_failing_for_five_days_is_disabled_until_enabled_again(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    watcher: Receiver,
    backend: str,
) -> None:
    client, admin, webhook_id, _ = await hooked(aiohttp_client, settings, clock, receiver, CREATED)
    body = {"url": watcher.url, "events": ["webhook.disabled"]}
    watching = await create_webhook(client, admin, body)
    receiver.status = 500
    started = clock()
    await create(client, admin, {"name": "k", "roles": ["developer"]})
    await attempted(client, admin, webhook_id)
    shown = await webhook_of(client, admin, webhook_id)
    assert shown["enabled"] is True and shown["disabledAt"] is None
    assert shown["failingSince"] == to_text(started)

    clock.advance(hours=119)  # the retry fails (and the delivery with it): not yet five days
    await attempted(client, admin, webhook_id, attempts=2)
    assert (await webhook_of(client, admin, webhook_id))["enabled"] is True
    clock.advance(hours=2)
    await create(client, admin, {"name": "k2", "roles": ["developer"]})
    await attempted(client, admin, webhook_id, count=2)
    disabled_at = to_text(clock())
    shown = await webhook_of(client, admin, webhook_id)
    assert (shown["enabled"], shown["disabledAt"]) == (False, disabled_at)
    assert shown["failingSince"] == to_text(started)

    (told,) = await watcher.wait_for(lambda got: len(got) >= 1)
    event = Webhook(watching["secret"]).verify(told.body, told.headers)
    assert event["type"] == "webhook.disabled"
    assert event["data"] == {
        "id": webhook_id, "url": receiver.url, "events": ["key.created"], "expiringDays": 7,
        "createdAt": shown["createdAt"], "enabled": False, "disabledAt": disabled_at,
        "failingSince": to_text(started),
    }  # fmt: skip
    log = await every_activity(client, admin)
    (off,) = [a for a in log if a["type"] == "webhook_update"]
    assert off["actorType"] == "system"
    assert (off["before"]["enabled"], off["after"]["enabled"]) == (True, False)
    assert off["after"]["webhookId"] == webhook_id

    # Disabled: sent nothing, and not retried by hand.
    seen = len(receiver.received)
    await create(client, admin, {"name": "k3", "roles": ["developer"]})
    await asyncio.sleep(0.5)
    assert len(receiver.received) == seen
    assert len(await deliveries(client, admin, webhook_id)) == 2
    (latest, _) = await deliveries(client, admin, webhook_id)
    response = await client.post(retry_url(admin, webhook_id, latest["id"]), headers=admin.headers)
    await assert_error(response, 409, DISABLED)
    assert len(watcher.received) == 1

    # Enabled again: the failure clock starts from nothing.
    url = hooks_url(admin, webhook_id)
    on = await assert_ok(await client.patch(url, json={"enabled": True}, headers=admin.headers))
    assert (on["enabled"], on["disabledAt"], on["failingSince"]) == (True, None, None)
    await create(client, admin, {"name": "k4", "roles": ["developer"]})
    await attempted(client, admin, webhook_id, count=3)
    shown = await webhook_of(client, admin, webhook_id)
    assert shown["enabled"] is True and shown["failingSince"] == to_text(clock())
    receiver.status = 204
    clock.advance(seconds=2)
    await receiver.wait_for(lambda got: any(r.status == 204 for r in got))
    for _ in range(100):
        if (await webhook_of(client, admin, webhook_id))["failingSince"] is None:
            break
        await asyncio.sleep(0.1)
    assert (await webhook_of(client, admin, webhook_id))["failingSince"] is None
    log = await every_activity(client, admin)
    changes = [a for a in log if a["type"] == "webhook_update"]
    assert [(a["actorType"], a["after"]["enabled"]) for a in changes] == [
        ("system", False), ("api", True),
    ]  # fmt: skip
    assert audit_verdict(settings).problem is None


async def test_patch_enables_and_disables_and_refuses_bad_bodies(
    client: Client, admin: Creds, backend: str
) -> None:
    body = {"url": "http://93.184.215.14/hooks", "events": ["key.created"]}
    webhook_id = (await create_webhook(client, admin, body))["webhook"]["id"]
    url = hooks_url(admin, webhook_id)
    off = await assert_ok(await client.patch(url, json={"enabled": False}, headers=admin.headers))
    assert off["enabled"] is False and off["disabledAt"] is not None
    await create(client, admin, {"name": "k", "roles": ["developer"]})
    assert await deliveries(client, admin, webhook_id) == []  # a disabled webhook gets none
    same = await assert_ok(await client.patch(url, json={"enabled": False}, headers=admin.headers))
    assert same == off
    for bad in ({"enabled": "yes"}, {"enabled": "true"}, {"enabled": 1},
                {"enabled": 0}):  # fmt: skip
        response = await client.patch(url, json=bad, headers=admin.headers)
        await assert_error(response, 400, "enabled: must be true or false")
    for bad, message in (
        ({}, "enabled: is required"),
        ({"enabled": None}, "enabled: must not be null"),
        ({"enabled": True, "url": "http://x"}, "url: is not a known field"),
    ):
        response = await client.patch(url, json=bad, headers=admin.headers)
        await assert_error(response, 400, message)
    missing = hooks_url(admin, "00000000-0000-4000-8000-000000000000")
    response = await client.patch(missing, json={"enabled": True}, headers=admin.headers)
    await assert_error(response, 404, NOT_FOUND)
    on = await assert_ok(await client.patch(url, json={"enabled": True}, headers=admin.headers))
    assert on["enabled"] is True
    await create(client, admin, {"name": "k2", "roles": ["developer"]})
    assert len(await deliveries(client, admin, webhook_id)) == 1
    log = await every_activity(client, admin)
    changes = [a["after"]["enabled"] for a in log if a["type"] == "webhook_update"]
    assert changes == [False, True]  # the PATCH that changed nothing recorded nothing
