"""Fair delivery through the real app: one organization's webhooks pointed at a
tarpit (a loopback receiver that accepts and never answers) hold neither another
organization's deliveries nor more than their share of the attempts under way: a
webhook makes one attempt at a time, an organization at most
``webhook_org_concurrency``, and the next due attempts go round the organizations."""

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from keysvc.config import Settings
from tests.api.webhooks import create_webhook, private_client
from tests.helpers import ClientFactory, FakeClock, bootstrap, create
from tests.receiver import Receiver, Tarpit

HOOKS_OF_A = 20
KEYS_OF_A = 5
# Far longer than the test: B's event must not wait for any of A's attempts to end.
TIMEOUT = 120.0


@pytest.fixture
async def tarpit() -> AsyncIterator[Tarpit]:
    started = await Tarpit().start()
    yield started
    await started.stop()


async def test_a_tarpit_tenant_does_not_hold_up_another(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    tarpit: Tarpit,
) -> None:
    client = await private_client(aiohttp_client, settings, clock, webhook_timeout=TIMEOUT)
    slow, healthy = await bootstrap(client.app, "slow"), await bootstrap(client.app, "healthy")
    for n in range(HOOKS_OF_A):
        await create_webhook(
            client, slow, {"url": tarpit.url(f"hook{n}"), "events": ["key.created"]}
        )
    for n in range(KEYS_OF_A):
        await create(client, slow, {"name": f"a{n}", "roles": ["developer"]})
    await create_webhook(client, healthy, {"url": receiver.url, "events": ["key.created"]})
    for _ in range(100):  # A's attempts are under way, and hang
        if tarpit.open:
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)

    started = time.monotonic()
    made = await create(client, healthy, {"name": "b", "roles": ["developer"]})
    (got,) = await receiver.wait_for(lambda received: len(received) >= 1, timeout=10)
    assert time.monotonic() - started < 3
    assert got.event["data"]["id"] == made["key"]["id"]
    assert got.event["organizationId"] == healthy.organization_id
    # A webhook never has two attempts under way; an organization holds at most its share.
    assert tarpit.most_per_path == 1
    assert 1 <= tarpit.most <= settings.webhook_org_concurrency < settings.webhook_concurrency
