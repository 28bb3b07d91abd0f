"""Webhook delivery through the real app to a real receiver on a loopback port: the
key events a write sends, signed (checked apart from keysvc's code), in the write's
transaction; retries on the app's clock, then failure after a day; no redirect
followed; the addresses checked again at delivery; the delivery log, paged; and a
receiver that hangs does not slow the API's writes."""

import asyncio
import hashlib
import hmac
import re
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from keysvc.config import Settings
from tests.api.webhooks import (
    attempted,
    create_webhook,
    deliveries,
    hooks_url,
    private_client,
)
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    create,
)
from tests.receiver import Receiver, signature_valid

KEY_EVENTS = ["key.created", "key.updated", "key.deleted"]
# The webhooks section moved from the README to the docs site (issue 38).
PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "events.md"


async def _setup(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver,
    events: list[str] = KEY_EVENTS, **changes: Any,
) -> tuple[Client, Creds, str, str]:  # fmt: skip
    """A client, its admin, and a webhook to ``receiver``: its ID and secret."""
    client = await private_client(aiohttp_client, settings, clock, **changes)
    admin = await bootstrap(client.app)
    created = await create_webhook(client, admin, {"url": receiver.url, "events": events})
    return client, admin, created["webhook"]["id"], created["secret"]


async def test_key_writes_send_signed_events(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, webhook_id, secret = await _setup(aiohttp_client, settings, clock, receiver)
    made = await create(client, admin, {"name": "ci", "roles": ["developer"]})
    key_url = f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"
    updated = await assert_ok(
        await client.patch(key_url, json={"name": "ci-2"}, headers=admin.headers)
    )
    await assert_ok(await client.delete(key_url, headers=admin.headers))

    received = await receiver.wait_for(lambda got: len(got) >= 3)
    await asyncio.sleep(0.3)  # nothing more comes
    assert len(receiver.received) == 3
    by_type = {r.event["type"]: r for r in received}
    assert set(by_type) == set(KEY_EVENTS)
    for event_type, request in by_type.items():
        event = request.event
        assert signature_valid(secret, request)
        assert not signature_valid("whsec_" + "A" * 43, request)
        assert request.headers["Keysvc-Event-Id"] == event["id"]
        assert request.headers["Keysvc-Event-Type"] == event_type
        assert request.headers["Content-Type"] == "application/json"
        assert request.headers["User-Agent"].startswith("keysvc-webhooks/")
        assert set(event) == {"id", "type", "createdAt", "organizationId", "data"}
        assert event["organizationId"] == admin.organization_id
        # The key's public fields, as GET renders them: no credentials, no hashes.
        assert made["keyId"] not in request.body.decode()
        assert made["keySecret"] not in request.body.decode()
    assert by_type["key.created"].event["data"] == made["key"]
    assert by_type["key.updated"].event["data"] == updated
    assert by_type["key.deleted"].event["data"] == updated
    assert len({r.event["id"] for r in received}) == 3

    log = await attempted(client, admin, webhook_id, count=3)
    assert [d["eventType"] for d in log] == ["key.deleted", "key.updated", "key.created"]
    for entry in log:
        assert entry["state"] == "delivered"
        assert entry["attemptCount"] == 1
        assert entry["nextAttemptAt"] is None
        assert [(a["status"], a["error"]) for a in entry["attempts"]] == [(204, None)]
        assert entry["eventId"] == by_type[entry["eventType"]].event["id"]


async def test_only_subscribed_events_of_its_own_organization(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, _, _ = await _setup(
        aiohttp_client, settings, clock, receiver, events=["key.deleted"]
    )
    other = await bootstrap(client.app, "other")
    for creds in (admin, other):
        made = await create(client, creds, {"name": "x", "roles": ["developer"]})
        url = f"/v1/organizations/{creds.organization_id}/keys/{made['key']['id']}"
        await assert_ok(await client.delete(url, headers=creds.headers))
    received = await receiver.wait_for(lambda got: len(got) >= 1)
    await asyncio.sleep(0.5)
    assert len(receiver.received) == 1
    assert received[0].event["type"] == "key.deleted"
    assert received[0].event["organizationId"] == admin.organization_id


async def test_a_refused_write_sends_nothing(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, webhook_id, _ = await _setup(aiohttp_client, settings, clock, receiver)
    made = await create(client, admin, {"name": "x", "roles": ["developer"]})
    await receiver.wait_for(lambda got: len(got) >= 1)
    url = f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"
    # 412: the write is refused inside its transaction, and its event goes with it.
    response = await client.patch(
        url, json={"name": "y"}, headers={**admin.headers, "If-Match": '"stale"'}
    )
    assert response.status == 412
    await asyncio.sleep(0.5)
    assert len(receiver.received) == 1
    assert len(await deliveries(client, admin, webhook_id)) == 1


async def test_failures_are_retried_with_backoff_until_delivered(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, webhook_id, secret = await _setup(aiohttp_client, settings, clock, receiver)
    receiver.status = 500
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    await receiver.wait_for(lambda got: len(got) >= 1)
    await asyncio.sleep(0.5)  # the app's clock stands still: no retry is due yet
    assert len(receiver.received) == 1
    (entry,) = await attempted(client, admin, webhook_id)
    assert entry["state"] == "pending"
    assert [(a["status"], a["error"]) for a in entry["attempts"]] == [(500, None)]
    assert entry["nextAttemptAt"] > entry["attempts"][0]["at"]

    clock.advance(seconds=1.1)  # past the first retry (1 s, less jitter), still failing
    await attempted(client, admin, webhook_id, attempts=2)
    receiver.status = 200
    clock.advance(seconds=2.1)  # the second waits twice as long
    received = await receiver.wait_for(lambda got: len(got) >= 3)
    assert len({r.event["id"] for r in received}) == 1  # one event, attempted three times
    assert all(signature_valid(secret, r) for r in received)
    (entry,) = await attempted(client, admin, webhook_id, attempts=3)
    assert entry["state"] == "delivered"
    assert entry["attemptCount"] == 3
    assert [a["status"] for a in entry["attempts"]] == [500, 500, 200]


async def test_a_delivery_fails_a_day_after_its_event(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, webhook_id, _ = await _setup(aiohttp_client, settings, clock, receiver)
    receiver.status = 503
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    await attempted(client, admin, webhook_id)
    clock.advance(hours=25)
    await receiver.wait_for(lambda got: len(got) >= 2)
    (entry,) = await attempted(client, admin, webhook_id, attempts=2)
    assert entry["state"] == "failed"
    assert entry["nextAttemptAt"] is None
    clock.advance(hours=25)
    await asyncio.sleep(1.5)
    assert len(receiver.received) == 2  # never again


async def test_a_redirect_is_not_followed(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, webhook_id, _ = await _setup(aiohttp_client, settings, clock, receiver)
    receiver.status = 302
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    await receiver.wait_for(lambda got: len(got) >= 1)
    (entry,) = await attempted(client, admin, webhook_id)
    assert entry["state"] == "pending"
    assert [(a["status"], a["error"]) for a in entry["attempts"]] == [(302, None)]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_delivery_checks_the_address_again(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    host: str,
) -> None:
    """A webhook made while private targets were allowed, delivered after they no longer
    are: refused at delivery, a literal address and a name alike (the name resolved and
    checked at connect, as a rebinding name would be)."""
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    url = receiver.url.replace("127.0.0.1", host)
    created = await create_webhook(client, admin, {"url": url, "events": ["key.created"]})
    await client.close()
    client = await private_client(aiohttp_client, settings, clock, webhook_allow_private=False)
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    log = await attempted(client, admin, created["webhook"]["id"])
    assert [(a["status"], a["error"]) for a in log[0]["attempts"]] == [(None, "blocked_address")]
    assert receiver.received == []


async def test_the_delivery_log_is_paged_newest_first(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, webhook_id, _ = await _setup(aiohttp_client, settings, clock, receiver)
    for n in range(3):
        await create(client, admin, {"name": f"k{n}", "roles": ["developer"]})
    await receiver.wait_for(lambda got: len(got) >= 3)
    url = hooks_url(admin, webhook_id, "/deliveries")
    response = await client.get(url, params={"limit": "2"}, headers=admin.headers)
    first = await response.json()
    assert response.status == 200 and first["totalCount"] == 3 and len(first["result"]) == 2
    response = await client.get(
        url, params={"limit": "2", "cursor": first["nextCursor"]}, headers=admin.headers
    )
    second = await response.json()
    assert len(second["result"]) == 1 and second["nextCursor"] is None
    names = [d["eventId"] for d in first["result"] + second["result"]]
    everything = await deliveries(client, admin, webhook_id)
    assert names == [d["eventId"] for d in everything]
    created_order = [r.event["data"]["name"] for r in receiver.received]
    assert sorted(created_order) == ["k0", "k1", "k2"]
    # A cursor is this webhook's own, and cannot be forged.
    other = await create_webhook(client, admin, {"url": receiver.url, "events": ["key.created"]})
    response = await client.get(
        hooks_url(admin, other["webhook"]["id"], "/deliveries"),
        params={"cursor": first["nextCursor"]},
        headers=admin.headers,
    )
    await assert_error(response, 400, "cursor: not a cursor from this list; start again without it")
    forged = first["nextCursor"].split(".")[0] + ".AAAA"
    response = await client.get(url, params={"cursor": forged}, headers=admin.headers)
    await assert_error(response, 400, "cursor: not a cursor from this list; start again without it")


async def test_a_hanging_receiver_does_not_slow_writes(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, webhook_id, _ = await _setup(
        aiohttp_client, settings, clock, receiver, webhook_timeout=120.0, webhook_concurrency=4,
        webhook_org_concurrency=4,
    )  # fmt: skip
    made = await create(client, admin, {"name": "x", "roles": ["developer"]})
    await receiver.wait_for(lambda got: len(got) >= 1)  # answered: the path is warm
    key_url = f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"

    async def writes(count: int) -> list[float]:
        took = []
        for n in range(count):
            started = time.perf_counter()
            await assert_ok(
                await client.patch(key_url, json={"name": f"n{n}"}, headers=admin.headers)
            )
            took.append(time.perf_counter() - started)
        return took

    await client.delete(hooks_url(admin, webhook_id), headers=admin.headers)
    quiet = await writes(20)  # no webhook at all
    for _ in range(4):  # a webhook makes one attempt at a time: one per slot
        await create_webhook(client, admin, {"url": receiver.url, "events": KEY_EVENTS})
    receiver.hang = True
    loaded = await writes(20)
    # Every slot holds a request the receiver never answers, and more wait in the outbox.
    await receiver.wait_for(lambda got: len(got) >= 1 + 4)
    assert not receiver.release.is_set()
    loaded += await writes(20)
    assert max(loaded) < 5  # far below the attempts' timeout (120 s)
    assert statistics.median(loaded) < 5 * statistics.median(quiet) + 0.05


async def test_the_readme_receiver_snippet_verifies_a_delivery(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    (snippet,) = [
        block
        for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
        if "Keysvc-Signature" in block  # the receiver's, not the client's examples
    ]
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    verify = namespace["verify"]
    client, admin, _, secret = await _setup(aiohttp_client, settings, clock, receiver)
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    (got,) = await receiver.wait_for(lambda received: len(received) >= 1)
    assert verify(secret, got.headers, got.body)
    assert not verify(secret, got.headers, got.body + b" ")
    assert not verify(secret[:-1] + "x", got.headers, got.body)
    # Correctly signed, but more than five minutes ago.
    then = str(int(time.time()) - 301)
    event = f"{got.headers['Keysvc-Event-Id']}.{got.headers['Keysvc-Event-Type']}."
    signed = f"{then}.{event}".encode() + got.body
    mac = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    stale = {**got.headers, "Keysvc-Signature": f"t={then},v2={mac}"}
    assert not verify(secret, stale, got.body)


async def test_finished_deliveries_are_kept_30_days(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, webhook_id, _ = await _setup(
        aiohttp_client, settings, clock, receiver, webhook_expiry_scan=0.1
    )
    receiver.status = 500
    await create(client, admin, {"name": "failing", "roles": ["developer"]})
    await attempted(client, admin, webhook_id)
    clock.advance(hours=25)  # past its day of retries: failed
    await attempted(client, admin, webhook_id, attempts=2)
    receiver.status = 204
    await create(client, admin, {"name": "delivered", "roles": ["developer"]})
    await attempted(client, admin, webhook_id)
    receiver.hang = True
    await create(client, admin, {"name": "pending", "roles": ["developer"]})
    await receiver.wait_for(lambda got: len(got) >= 4)
    log = await deliveries(client, admin, webhook_id)
    assert [d["state"] for d in log] == ["pending", "delivered", "failed"]

    clock.advance(days=28, hours=12)  # the failed one's event: 29.5 days ago
    await asyncio.sleep(0.5)
    assert len(await deliveries(client, admin, webhook_id)) == 3
    clock.advance(days=1)  # 30.5 days: it goes, with its attempts; the others stay
    for _ in range(100):
        log = await deliveries(client, admin, webhook_id)
        if len(log) < 3:
            break
        await asyncio.sleep(0.1)
    assert [d["state"] for d in log] == ["pending", "delivered"]
