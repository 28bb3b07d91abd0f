"""Standard Webhooks, through the real app and its delivery task to a real loopback
receiver, checked with the ``standardwebhooks`` PyPI package (not keysvc's code): a new
webhook's secret is a ``whsec_`` secret that library reads as it is; every delivery
carries webhook-id, webhook-timestamp and webhook-signature, which the library accepts,
and refuses once the body, the secret or the timestamp is another; a retry keeps its
webhook-id; Keysvc-Signature is still sent; and a webhook made before (its secret in
the older URL-safe form) verifies with that secret turned into standard base64."""

import asyncio
import base64
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from keysvc.config import Settings
from tests.api.webhooks import attempted, hooked
from tests.handsql import hand_sql
from tests.helpers import Client, ClientFactory, FakeClock, assert_ok, create
from tests.receiver import Received, Receiver, signature_valid, standard_valid

KEY_EVENTS = ["key.created", "key.updated", "key.deleted"]
# The webhooks section moved from the README to the docs site (issue 38).
PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "events.md"


def standard_form(old: str) -> str:
    """What docs/concepts/events.md tells an older webhook's receiver to do with its secret."""
    encoded = old.removeprefix("whsec_")
    raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    return "whsec_" + base64.b64encode(raw).decode()


def assert_standard(secret: str, got: Received) -> None:
    """``got`` verifies with the library, and not with its body, secret or time changed."""
    headers = got.headers
    assert Webhook(secret).verify(got.body, headers) == got.event
    assert headers["webhook-id"] == got.event["id"] == headers["Keysvc-Event-Id"]
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 30
    assert not standard_valid(secret, got.body + b" ", headers)
    assert not standard_valid(secret, got.body.replace(b'"data"', b'"Data"'), headers)
    assert not standard_valid("whsec_" + base64.b64encode(b"x" * 32).decode(), got.body, headers)
    # Correctly signed with the right secret, but more than five minutes ago.
    then = datetime.now(UTC) - timedelta(seconds=301)
    stale = {
        **headers,
        "webhook-timestamp": str(int(then.timestamp())),
        "webhook-signature": Webhook(secret).sign(headers["webhook-id"], then, got.body.decode()),
    }
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(got.body, stale)
    fresh = {**stale, "webhook-timestamp": headers["webhook-timestamp"]}
    assert not standard_valid(secret, got.body, fresh)  # the time is signed too


async def test_every_delivery_verifies_with_a_standard_webhooks_library(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    backend: str,
) -> None:
    client, admin, webhook_id, secret = await hooked(
        aiohttp_client, settings, clock, receiver, KEY_EVENTS
    )
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret.removeprefix("whsec_"), validate=True)) == 32
    made = await create(client, admin, {"name": "ci", "roles": ["developer"]})
    key_url = f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"
    await assert_ok(await client.patch(key_url, json={"name": "ci-2"}, headers=admin.headers))
    await assert_ok(await client.delete(key_url, headers=admin.headers))
    received = await receiver.wait_for(lambda got: len(got) >= 3)
    assert sorted(r.event["type"] for r in received) == sorted(KEY_EVENTS)
    for got in received:
        assert_standard(secret, got)
        assert signature_valid(secret, got)  # Keysvc-Signature, for existing receivers
        parts = got.headers["Keysvc-Signature"].split(",")
        assert parts[0] == "t=" + got.headers["webhook-timestamp"]
        assert len(got.headers["webhook-signature"].split(" ")) == 1
    assert len({r.headers["webhook-id"] for r in received}) == 3
    log = await attempted(client, admin, webhook_id, count=3)
    assert all(d["state"] == "delivered" for d in log)


async def test_a_retry_keeps_its_webhook_id_and_signs_its_own_time(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    backend: str,
) -> None:
    client, admin, webhook_id, secret = await hooked(
        aiohttp_client, settings, clock, receiver, KEY_EVENTS
    )
    receiver.status = 500
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    await attempted(client, admin, webhook_id)
    receiver.status = 204
    await asyncio.sleep(1.1)  # a second later, by the wall clock the timestamp is read from
    clock.advance(seconds=1.1)  # past the first retry (1 s, less jitter)
    first, second = await receiver.wait_for(lambda got: len(got) >= 2)
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == first.event["id"]
    assert first.body == second.body
    assert int(second.headers["webhook-timestamp"]) > int(first.headers["webhook-timestamp"])
    for got in (first, second):
        assert_standard(secret, got)
    log = await attempted(client, admin, webhook_id, attempts=2)
    assert log[0]["state"] == "delivered"


async def test_a_webhook_made_before_standard_webhooks_keeps_its_secret(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    backend: str,
) -> None:
    """A webhook whose row has secret_version 2 (made before Standard Webhooks) keeps
    the secret it was shown, in its URL-safe form, for Keysvc-Signature; turned into
    standard base64, the same secret verifies webhook-signature."""
    client, admin, webhook_id, new_form = await hooked(
        aiohttp_client, settings, clock, receiver, KEY_EVENTS
    )
    hand_sql(settings, "update webhooks set secret_version = 2 where id = ?", webhook_id)
    raw = base64.b64decode(new_form.removeprefix("whsec_"))
    old = "whsec_" + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    (got,) = await receiver.wait_for(lambda received: len(received) >= 1)
    assert signature_valid(old, got)
    assert not signature_valid(new_form, got)
    assert standard_form(old) == new_form
    assert_standard(standard_form(old), got)
    assert standard_valid(raw, got.body, got.headers)  # the library also takes the bytes


async def test_the_readme_standard_webhooks_receiver_verifies_a_delivery(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    (snippet,) = re.findall(r"```py\n(.*?)```", PAGE.read_text(), re.S)
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    receive = namespace["receive_standard"]
    client, admin, _, secret = await hooked(aiohttp_client, settings, clock, receiver, KEY_EVENTS)
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    (got,) = await receiver.wait_for(lambda received: len(received) >= 1)
    handled: list[dict[str, Any]] = []
    assert receive(secret, got.headers, got.body, handled.append) == 200
    assert handled == [got.event]
    assert receive(secret, got.headers, got.body + b" ", handled.append) == 401
    other = "whsec_" + base64.b64encode(b"y" * 32).decode()
    assert receive(other, got.headers, got.body, handled.append) == 401
    assert len(handled) == 1


async def test_the_openapi_document_describes_the_signed_delivery(client: Client) -> None:
    response = await client.get("/v1/openapi.json")
    document = await response.json()
    post = document["webhooks"]["keysvcEvent"]["post"]
    names = {p["name"] for p in post["parameters"] if p["in"] == "header"}
    assert {"webhook-id", "webhook-timestamp", "webhook-signature", "Keysvc-Signature"} <= names
    created = document["components"]["schemas"]["WebhookCreateResponse"]["properties"]
    assert created["secret"]["pattern"] == "^whsec_[A-Za-z0-9+/]{43}=$"
