"""What the webhook tests share: their URLs, a create through the API, a client whose
app may send webhooks to the loopback receiver quickly (and a webhook to it), and the
whole activity log."""

import asyncio
from typing import Any

from keysvc.config import Settings
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    bootstrap,
    client_with,
)
from tests.receiver import Receiver

# The create's refusal of a non-public host, as docs/concepts/events.md describes it.
PRIVATE = (
    "url: {} is, or resolves to, a loopback, private or otherwise non-public address; give a"
    " public host (an operator may allow private targets with KEYSVC_WEBHOOK_ALLOW_PRIVATE=1)"
)
# Every key event type, as docs/concepts/events.md lists them (webhook.disabled is the other one).
ALL_EVENTS = [
    "key.created", "key.updated", "key.deleted", "key.rotated", "key.expiring",
    "key.used_after_revoke", "key.leaked", "key.credits_low", "key.credits_exhausted",
]  # fmt: skip


def hooks_url(creds: Creds, webhook_id: str | None = None, tail: str = "") -> str:
    base = f"/v1/organizations/{creds.organization_id}/webhooks"
    return (base if webhook_id is None else f"{base}/{webhook_id}") + tail


async def create_webhook(client: Client, caller: Creds, body: dict[str, Any]) -> dict[str, Any]:
    """Create a webhook through the API; the whole result (webhook and secret)."""
    response = await client.post(hooks_url(caller), json=body, headers=caller.headers)
    result: dict[str, Any] = await assert_ok(response)
    return result


async def deliveries(client: Client, caller: Creds, webhook_id: str) -> list[dict[str, Any]]:
    response = await client.get(
        hooks_url(caller, webhook_id, "/deliveries"), headers=caller.headers
    )
    result: list[dict[str, Any]] = await assert_ok(response)
    return result


async def private_client(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, **changes: Any
) -> Client:
    """A client of an app that may send webhooks to loopback, retrying after a second."""
    changes = {"webhook_allow_private": True, "webhook_retry_seconds": 1.0, **changes}
    return await client_with(aiohttp_client, settings, clock, **changes)


async def hooked(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver,
    events: list[str],
) -> tuple[Client, Creds, str, str]:  # fmt: skip
    """A private client, its admin, and a webhook of ``events`` to ``receiver``: its ID
    and secret."""
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    created = await create_webhook(client, admin, {"url": receiver.url, "events": events})
    return client, admin, created["webhook"]["id"], created["secret"]


async def attempted(
    client: Client, caller: Creds, webhook_id: str, *, count: int = 1, attempts: int = 1
) -> list[dict[str, Any]]:
    """The webhook's delivery log once it holds ``count`` deliveries with ``attempts``
    attempts recorded each (a receiver sees a request before keysvc records its answer)."""
    log: list[dict[str, Any]] = []
    for _ in range(300):
        log = await deliveries(client, caller, webhook_id)
        if len(log) >= count and all(len(d["attempts"]) >= attempts for d in log[:count]):
            return log
        await asyncio.sleep(0.1)
    raise AssertionError(f"not attempted {attempts} times: {log}")


def activities_url(creds: Creds, query: str) -> str:
    return f"/v1/organizations/{creds.organization_id}/activities?{query}"


async def every_activity(client: Client, creds: Creds) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor = ""
    while True:
        query = "limit=3&include=keysvc" + (f"&cursor={cursor}" if cursor else "")
        response = await client.get(activities_url(creds, query), headers=creds.headers)
        body = await response.json()
        assert response.status == 200, body
        found += body["result"]
        if body["nextCursor"] is None:
            return found
        cursor = body["nextCursor"]
