"""A webhook's secret rotation through the real app, its delivery task and a real
loopback receiver, checked with the ``standardwebhooks`` package: the new secret is
shown once; during the overlap (a day by default, or as asked) every delivery verifies
with the new secret and with the replaced one, and after it with the new one only; a
second rotation ends the oldest secret at once; the rotation is an activity without
the secret, and the audit chain still verifies; bad bodies, unknown webhooks and keys
without ``webhooks:write`` are refused."""

import base64
import hashlib
import hmac
from datetime import timedelta
from typing import Any

from keysvc.config import Settings
from keysvc.timeutil import to_text
from tests.api.webhooks import create_webhook, every_activity, hooked, hooks_url
from tests.handsql import audit_verdict
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    create,
    create_creds,
    create_role,
)
from tests.receiver import Received, Receiver, standard_valid

DAY = 86400
CREATED = ["key.created"]
NOT_FOUND = "webhook not found in this organization"


def keysvc_signed(secret: str, got: Received) -> bool:
    """Any v2 of Keysvc-Signature is the secret's (as docs/concepts/events.md's receiver checks)."""
    parts = [p.split("=", 1) for p in got.headers["Keysvc-Signature"].split(",")]
    t = dict(parts)["t"]
    event = (got.headers["Keysvc-Event-Id"], got.headers["Keysvc-Event-Type"])
    signed = ".".join([t, *event]).encode() + b"." + got.body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return any(name == "v2" and hmac.compare_digest(expected, v) for name, v in parts)


async def rotate(
    client: Client, caller: Creds, webhook_id: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    url = hooks_url(caller, webhook_id, "/rotate-secret")
    response = await client.post(url, json=body, headers=caller.headers)
    result: dict[str, Any] = await assert_ok(response)
    return result


async def next_delivery(client: Client, admin: Creds, receiver: Receiver) -> Received:
    """A key created, and the delivery of its event."""
    seen = len(receiver.received)
    await create(client, admin, {"name": "k", "roles": ["developer"]})
    received = await receiver.wait_for(lambda got: len(got) > seen)
    return received[seen]


async def test_both_secrets_sign_during_the_overlap_and_the_new_one_after(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    backend: str,
) -> None:
    client, admin, webhook_id, old = await hooked(
        aiohttp_client, settings, clock, receiver, ["key.created"]
    )
    rotated = await rotate(client, admin, webhook_id)
    new = rotated["secret"]
    assert new != old and new.startswith("whsec_")
    assert len(base64.b64decode(new.removeprefix("whsec_"), validate=True)) == 32
    expires = to_text(clock() + timedelta(seconds=DAY))
    assert rotated["webhook"]["id"] == webhook_id
    assert rotated["webhook"]["previousSecretExpiresAt"] == expires
    response = await client.get(hooks_url(admin, webhook_id), headers=admin.headers)
    shown = await assert_ok(response)
    assert shown["previousSecretExpiresAt"] == expires
    assert new not in repr(shown)

    during = await next_delivery(client, admin, receiver)
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert standard_valid(new, during.body, during.headers) and standard_valid(
        old, during.body, during.headers
    )
    assert keysvc_signed(new, during) and keysvc_signed(old, during)
    assert not standard_valid(new, during.body + b" ", during.headers)

    clock.advance(seconds=DAY - 5)  # still within it
    got = await next_delivery(client, admin, receiver)
    assert standard_valid(old, got.body, got.headers)

    clock.advance(seconds=10)  # the overlap is over
    after = await next_delivery(client, admin, receiver)
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    assert standard_valid(new, after.body, after.headers) and not standard_valid(
        old, after.body, after.headers
    )
    assert keysvc_signed(new, after) and not keysvc_signed(old, after)


async def test_an_overlap_as_asked_and_a_second_rotation_ends_the_oldest(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    backend: str,
) -> None:
    client, admin, webhook_id, first = await hooked(
        aiohttp_client, settings, clock, receiver, ["key.created"]
    )
    second = (await rotate(client, admin, webhook_id, {"overlapSeconds": 600}))["secret"]
    third = (await rotate(client, admin, webhook_id, {"overlapSeconds": 600}))["secret"]
    got = await next_delivery(client, admin, receiver)
    assert (
        standard_valid(third, got.body, got.headers)
        and standard_valid(second, got.body, got.headers)
        and not standard_valid(first, got.body, got.headers)
    )
    clock.advance(seconds=601)
    got = await next_delivery(client, admin, receiver)
    assert standard_valid(third, got.body, got.headers) and not standard_valid(
        second, got.body, got.headers
    )

    fourth = (await rotate(client, admin, webhook_id, {"overlapSeconds": 0}))["secret"]
    got = await next_delivery(client, admin, receiver)
    assert standard_valid(fourth, got.body, got.headers) and not standard_valid(
        third, got.body, got.headers
    )
    assert len(got.headers["webhook-signature"].split(" ")) == 1


async def test_a_rotation_is_recorded_without_its_secret(
    client: Client, admin: Creds, settings: Settings, clock: FakeClock, backend: str
) -> None:
    body = {"url": "http://93.184.215.14/hooks", "events": ["key.created"]}
    created = await create_webhook(client, admin, body)
    webhook_id = created["webhook"]["id"]
    rotated = await rotate(client, admin, webhook_id, {"overlapSeconds": 3600})
    log = await every_activity(client, admin)
    (entry,) = [a for a in log if a["type"] == "webhook_secret_rotate"]
    assert entry["actorId"] == admin.id
    assert entry["after"] == {
        "webhookId": webhook_id,
        "url": body["url"],
        "events": ["key.created"],
        "expiringDays": 7,
        "previousSecretExpiresAt": to_text(clock() + timedelta(hours=1)),
    }
    for secret in (created["secret"], rotated["secret"]):
        assert secret.removeprefix("whsec_") not in repr(log)
    assert audit_verdict(settings).problem is None


async def test_refusals(client: Client, admin: Creds, other_admin: Creds, backend: str) -> None:
    body = {"url": "http://93.184.215.14/hooks", "events": ["key.created"]}
    webhook_id = (await create_webhook(client, admin, body))["webhook"]["id"]
    url = hooks_url(admin, webhook_id, "/rotate-secret")
    for bad in ({"overlapSeconds": -1}, {"overlapSeconds": 7 * DAY + 1},
                {"overlapSeconds": "1"}, {"overlapSeconds": 1.5}, {"other": 1}):  # fmt: skip
        response = await client.post(url, json=bad, headers=admin.headers)
        assert response.status == 400, bad
    assert (await rotate(client, admin, webhook_id, {"overlapSeconds": 7 * DAY}))["secret"]
    response = await client.post(url, json={"overlapSeconds": -1}, headers=admin.headers)
    await assert_error(
        response, 400, "overlapSeconds: must be an integer from 0 to 604800 (7 days)"
    )
    missing = hooks_url(admin, "00000000-0000-4000-8000-000000000000", "/rotate-secret")
    await assert_error(await client.post(missing, headers=admin.headers), 404, NOT_FOUND)
    elsewhere = hooks_url(other_admin, webhook_id, "/rotate-secret")
    response = await client.post(elsewhere, headers=other_admin.headers)
    await assert_error(response, 404, NOT_FOUND)
    role = await create_role(client, admin, {"name": "r", "permissions": ["webhooks:read"]})
    reader = await create_creds(client, admin, {"name": "r", "assignedRoleIds": [role["id"]]})
    refused = await client.post(url, headers=reader.headers)
    await assert_error(refused, 403, "this key lacks the permission webhooks:write")
