"""Issue 29's credit events: ``key.credits_low`` once, when a key's remaining credits
first fall to 10% of its last set or refill amount; ``key.credits_exhausted`` once per
exhaustion, again only after an increase or a refill. Sent in the spend's own
transaction, delivered to a real receiver on a loopback port."""

import asyncio

from keysvc.config import Settings
from tests.api.webhooks import create_webhook, private_client
from tests.helpers import ClientFactory, FakeClock, assert_ok, bootstrap, create_creds
from tests.receiver import Receiver, signature_valid

EVENTS = ["key.credits_low", "key.credits_exhausted"]


async def test_low_once_and_exhausted_once_per_exhaustion(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    hook = await create_webhook(client, admin, {"url": receiver.url, "events": EVENTS})
    key = await create_creds(
        client,
        admin,
        {"name": "metered", "roles": ["developer"], "credits": {"remaining": 20}},
    )
    verify = "/v1/verify"
    # 20 -> 3 (at most 2 is 10%: not yet), then 2 (low), 1, 0 (exhausted), refused x3.
    assert (await client.get(verify + "?cost=17", headers=key.headers)).status == 200
    statuses = [(await client.get(verify, headers=key.headers)).status for _ in range(6)]
    assert statuses == [200, 200, 200, 429, 429, 429]
    received = await receiver.wait_for(lambda got: len(got) >= 2)
    await asyncio.sleep(0.3)  # nothing more comes
    assert [r.event["type"] for r in receiver.received] == EVENTS
    for request in received:
        assert signature_valid(hook["secret"], request)
        assert request.event["data"]["id"] == key.id
    low, exhausted = (r.event["data"]["credits"]["remaining"] for r in received)
    assert (low, exhausted) == (2, 0)
    # An increase ends the exhaustion: the next one is sent again; low is not (still low).
    url = f"/v1/organizations/{admin.organization_id}/keys/{key.id}/credits"
    await assert_ok(await client.post(url, json={"increment": 1}, headers=admin.headers))
    statuses = [(await client.get(verify, headers=key.headers)).status for _ in range(3)]
    assert statuses == [200, 429, 429]
    await receiver.wait_for(lambda got: len(got) >= 3)
    await asyncio.sleep(0.3)
    assert [r.event["type"] for r in receiver.received] == [*EVENTS, "key.credits_exhausted"]
    # A set starts again: low and exhausted are each sent once more.
    await assert_ok(await client.post(url, json={"set": 10}, headers=admin.headers))
    statuses = [(await client.get(verify, headers=key.headers)).status for _ in range(11)]
    assert statuses == [200] * 10 + [429]
    await receiver.wait_for(lambda got: len(got) >= 5)
    await asyncio.sleep(0.3)
    assert [r.event["type"] for r in receiver.received][3:] == EVENTS
