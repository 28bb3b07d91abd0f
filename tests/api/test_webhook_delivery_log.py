"""The delivery log is read as one snapshot: an attempt's outcome and its delivery's
state are committed together, so no page may show one without the other, however the
read and the deliveries' commits interleave."""

import asyncio
from typing import Any

from keysvc.config import Settings
from tests.api.webhooks import create_webhook, hooks_url, private_client
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    bootstrap,
    create,
)
from tests.receiver import Receiver

DELIVERIES = 60
# Seconds they all have to be delivered in: ten times what they take alone.
DELIVER_WITHIN = 60.0


def torn(delivery: dict[str, Any]) -> bool:
    """Whether the delivery's state disagrees with its attempts: delivered exactly when
    its last attempt got a 2xx, and counted as many times as it is listed."""
    attempts = delivery["attempts"]
    last_ok = bool(attempts) and attempts[-1]["status"] is not None and attempts[-1]["status"] < 300
    return (delivery["state"] == "delivered") != last_ok or delivery["attemptCount"] != len(
        attempts
    )


async def test_a_page_never_shows_an_attempt_without_its_state(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client: Client = await private_client(aiohttp_client, settings, clock)
    admin: Creds = await bootstrap(client.app)
    hook = await create_webhook(client, admin, {"url": receiver.url, "events": ["key.created"]})
    url = hooks_url(admin, hook["webhook"]["id"], f"/deliveries?limit={DELIVERIES}")
    receiver.hang = True  # nothing is delivered until the reads have begun
    await asyncio.gather(
        *(
            create(client, admin, {"name": f"k{i}", "roles": ["developer"]})
            for i in range(DELIVERIES)
        )
    )
    page = await assert_ok(await client.get(url, headers=admin.headers))
    assert [d["state"] for d in page] == ["pending"] * DELIVERIES
    receiver.release.set()
    # Read while the deliveries are being recorded, for as long as they take: one
    # webhook's go one after another, each noticed within the worker's watch interval,
    # so 60 take some 6 s, and 3,000 pages read alone were sometimes over first.
    loop = asyncio.get_running_loop()
    deadline, pages = loop.time() + DELIVER_WITHIN, 0
    while loop.time() < deadline:
        pages += 1
        page = await assert_ok(await client.get(url, headers=admin.headers))
        shown = [(d["state"], [a["status"] for a in d["attempts"]]) for d in page if torn(d)]
        assert shown == [], f"page {pages}: a state that disagrees with its attempts"
        if all(d["state"] == "delivered" for d in page):
            return
    raise AssertionError(f"the deliveries were not all delivered in {DELIVER_WITHIN} s")
