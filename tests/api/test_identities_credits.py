"""Issue 36 on /v1/verify, through the real app on both backends: a key whose identity
has credits spends from them; a key with credits of its own and an identity with
credits spends from both, or from neither; the 429 says which ran out; a change to the
identity's credits reaches the next verify; the events go to webhooks."""

import asyncio
import threading
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.http.state import STORE
from tests.api.createtrace import trace_creates
from tests.api.webhooks import create_webhook, private_client
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    create_creds,
)
from tests.receiver import Receiver, signature_valid

VERIFY = "/v1/verify"


def _identities(creds: Creds, identity: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/identities"
    return base if identity is None else f"{base}/{identity}"


async def _identity(client: Client, admin: Creds, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(_identities(admin), json=body, headers=admin.headers)
    result: dict[str, Any] = await assert_ok(response)
    return result


async def _key(client: Client, admin: Creds, external_id: str, **extra: Any) -> Creds:
    body = {"name": "k", "roles": ["developer"], "externalId": external_id, **extra}
    return await create_creds(client, admin, body)


async def _remaining(client: Client, admin: Creds, identity_id: str) -> int:
    found = await assert_ok(
        await client.get(_identities(admin, identity_id), headers=admin.headers)
    )
    remaining: int = found["credits"]["remaining"]
    return remaining


async def test_keys_of_an_identity_spend_its_credits(client: Client, admin: Creds) -> None:
    identity = await _identity(client, admin, {"externalId": "cust", "credits": {"remaining": 5}})
    first, second = await _key(client, admin, "cust"), await _key(client, admin, "cust")
    lefts = []
    for key, cost in ((first, 2), (second, 1), (first, 2)):
        response = await client.get(VERIFY, headers={**key.headers, "X-Credit-Cost": str(cost)})
        assert response.status == 200
        assert "X-Credits-Remaining" not in response.headers
        assert response.headers["Cache-Control"] == "no-store"
        lefts.append(response.headers["X-Credits-Identity-Remaining"])
    assert lefts == ["3", "2", "0"]
    refused = await client.get(VERIFY, headers=second.headers)
    await assert_error(
        refused, 429, "credits exhausted for this key's identity: 0 remaining; no refill is due"
    )
    assert await _remaining(client, admin, identity["id"]) == 0
    # A key of another externalId, or none, spends nothing of it.
    other = await _key(client, admin, "someone-else")
    assert (await client.get(VERIFY, headers=other.headers)).status == 200


async def test_both_owners_spend_or_neither_does(client: Client, admin: Creds) -> None:
    identity = await _identity(client, admin, {"externalId": "both", "credits": {"remaining": 3}})
    key = await _key(client, admin, "both", credits={"remaining": 10})
    ok = await client.get(VERIFY, headers={**key.headers, "X-Credit-Cost": "2"})
    assert ok.headers["X-Credits-Remaining"] == "8"
    assert ok.headers["X-Credits-Identity-Remaining"] == "1"
    # The identity has 1 left: a cost of 2 is refused and spends nothing of the key's.
    refused = await client.get(VERIFY, headers={**key.headers, "X-Credit-Cost": "2"})
    await assert_error(
        refused, 429, "credits exhausted for this key's identity: 1 remaining; no refill is due"
    )
    url = f"/v1/organizations/{admin.organization_id}/keys/{key.id}"
    got = await assert_ok(await client.get(url, headers=admin.headers))
    assert got["credits"]["remaining"] == 8
    assert await _remaining(client, admin, identity["id"]) == 1
    # The key has less than the cost: refused, and the identity keeps its credit.
    await assert_ok(await client.post(url + "/credits", json={"set": 0}, headers=admin.headers))
    refused = await client.get(VERIFY, headers=key.headers)
    await assert_error(
        refused, 429, "credits exhausted for this key: 0 remaining; no refill is due"
    )
    assert await _remaining(client, admin, identity["id"]) == 1
    answer = await assert_ok(
        await client.post(url + "/credits", json={"set": 5}, headers=admin.headers)
    )
    assert answer["credits"]["remaining"] == 5
    json_answer = await client.get(VERIFY, headers={**key.headers, "Accept": "application/json"})
    result = await assert_ok(json_answer)
    assert result["credits"] == {"remaining": 4}
    assert result["identityCredits"] == {"remaining": 0}
    assert result["identity"] == {"id": identity["id"], "externalId": "both", "meta": None}


async def test_a_change_to_the_identitys_credits_reaches_the_next_verify(
    client: Client, admin: Creds
) -> None:
    key = await _key(client, admin, "later")
    assert (await client.get(VERIFY, headers=key.headers)).status == 200  # cached: no credits
    found = await assert_ok(
        await client.get(_identities(admin) + "?externalId=later", headers=admin.headers)
    )
    credits = _identities(admin, found[0]["id"]) + "/credits"
    await assert_ok(await client.post(credits, json={"set": 1}, headers=admin.headers))
    spent = await client.get(VERIFY, headers=key.headers)
    assert spent.headers["X-Credits-Identity-Remaining"] == "0"
    assert (await client.get(VERIFY, headers=key.headers)).status == 429
    await assert_ok(await client.post(credits, json={"set": None}, headers=admin.headers))
    assert (await client.get(VERIFY, headers=key.headers)).status == 200
    await assert_ok(await client.post(credits, json={"set": 0}, headers=admin.headers))
    assert (await client.get(VERIFY, headers=key.headers)).status == 429
    await assert_ok(await client.delete(_identities(admin, found[0]["id"]), headers=admin.headers))
    assert (await client.get(VERIFY, headers=key.headers)).status == 200  # nothing shared


async def test_concurrent_verifies_of_an_identitys_keys_spend_exactly(
    client: Client, admin: Creds
) -> None:
    identity = await _identity(client, admin, {"externalId": "busy", "credits": {"remaining": 50}})
    keys = [await _key(client, admin, "busy") for _ in range(4)]
    answers = await asyncio.gather(
        *(client.get(VERIFY, headers=keys[n % 4].headers) for n in range(80))
    )
    statuses = [answer.status for answer in answers]
    assert statuses.count(200) == 50 and statuses.count(429) == 30
    assert await _remaining(client, admin, identity["id"]) == 0


async def test_concurrent_verifies_of_several_identities_spend_each_exactly(
    client: Client, admin: Creds
) -> None:
    # Sent at once, the spends share batches, each batch reading several identities'
    # credits together (keysvc.db.credits): each is spent its own count, no other's.
    budgets = {"cust-a": 7, "cust-b": 12, "cust-c": 30, "cust-d": 5}
    made = {name: await _identity(client, admin, {"externalId": name, "credits": {"remaining": n}})
            for name, n in budgets.items()}  # fmt: skip
    keys = {name: await _key(client, admin, name) for name in budgets}
    sent = [name for name in budgets for _ in range(10)]  # 10 verifies a customer
    answers = await asyncio.gather(*(client.get(VERIFY, headers=keys[n].headers) for n in sent))
    for name, budget in budgets.items():
        statuses = [a.status for n, a in zip(sent, answers, strict=True) if n == name]
        assert statuses.count(200) == min(10, budget), name
        assert await _remaining(client, admin, made[name]["id"]) == max(0, budget - 10), name


@pytest.mark.sqlite_only  # SQLite's writer threads (keysvc.db.sqlite.createbatch)
async def test_a_spend_batch_runs_its_statements_on_the_loop_and_commits_on_a_thread(
    client: Client, admin: Creds
) -> None:
    # Issue 36, round 3: each hand-over to a connection's thread waited for a busy loop
    # (docs/PERFORMANCE.md); a batch now makes one, its commit. Every statement of the
    # spends, on either writing connection, is traced with the thread that ran it.
    await _identity(client, admin, {"externalId": "fast", "credits": {"remaining": 100}})
    keys = [await _key(client, admin, "fast") for _ in range(4)]
    for key in keys:  # their usedAt written for this minute: the spends alone follow
        assert (await client.get(VERIFY, headers=key.headers)).status == 200
    store, loop_thread = client.app[STORE], threading.get_ident()
    ran: list[tuple[bool, str]] = []

    def trace(sql: str) -> None:
        ran.append((threading.get_ident() == loop_thread, " ".join(sql.split()).lower()))

    await store.writer.conn.set_trace_callback(trace)
    await trace_creates(store, trace)
    answers = await asyncio.gather(*(client.get(VERIFY, headers=k.headers) for k in keys * 8))
    await store.writer.conn.set_trace_callback(None)
    await trace_creates(store, None)
    assert [a.status for a in answers] == [200] * 32
    credits = [on_loop for on_loop, sql in ran if "credits_remaining" in sql]
    assert credits and all(credits), ran  # the reads and the writes, on the loop
    assert {sql for on_loop, sql in ran if not on_loop} <= {"commit"}, ran


async def test_an_identitys_credit_events_reach_its_webhooks(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    events = ["identity.credits_low", "identity.credits_exhausted"]
    hook = await create_webhook(client, admin, {"url": receiver.url, "events": events})
    identity = await _identity(client, admin, {"externalId": "evt", "credits": {"remaining": 10}})
    key = await _key(client, admin, "evt")
    statuses = [
        (await client.get(f"{VERIFY}?cost=3", headers=key.headers)).status for _ in range(4)
    ]
    assert statuses == [200, 200, 200, 429]  # 7, 4, 1 (low), then 1 < 3: refused
    one = await client.get(VERIFY, headers=key.headers)
    assert one.status == 200  # 0: exhausted
    received = await receiver.wait_for(lambda got: len(got) >= 2)
    await asyncio.sleep(0.3)  # nothing more comes
    assert [r.event["type"] for r in receiver.received] == events
    for request in received:
        assert signature_valid(hook["secret"], request)
        assert request.event["data"]["id"] == identity["id"]
        assert request.event["data"]["externalId"] == "evt"
    assert [r.event["data"]["credits"]["remaining"] for r in received] == [1, 0]
