"""Revoke by secret (``POST /v1/keys/revoke-leaked``) through the real app on both
backends: the key whose secret it is gets disabled and its credentials refused once the
report's work, queued after the answer, is done,
a ``key_leaked`` activity and a ``key.leaked`` delivery exist, the answer is the same for
a miss, a report again changes nothing, malformed bodies are 400s, reports are
throttled like failed logins, and ``keysvc audit verify`` still passes."""

import asyncio
from typing import Any

from keysvc.config import Settings
from keysvc.http.state import LEAK_REPORTS
from tests.api.activities import listed
from tests.api.webhooks import create_webhook, deliveries, private_client
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
    get_key,
    hash_data,
)
from tests.receiver import Receiver

REVOKE = "/v1/keys/revoke-leaked"
MISS = "keysvc_" + "A" * 42


async def _revoke(client: Client, secret: str, **headers: str) -> dict[str, Any]:
    response = await client.post(REVOKE, json={"secret": secret}, headers=headers)
    body: dict[str, Any] = await response.json()
    assert response.status == 200, body
    assert set(body) == {"status", "requestId", "result"}
    assert body["result"] == {"status": "received"}
    assert response.headers["X-Request-Id"] == body["requestId"]
    assert secret not in await response.text()
    await client.app[LEAK_REPORTS].work_through()  # the work a hit causes comes after the answer
    return body


async def _state(client: Client, admin: Creds, key_id: str) -> str:
    state: str = (await get_key(client, admin, key_id))["state"]
    return state


async def test_a_reported_secret_disables_its_key_at_once(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    hook = await create_webhook(
        client, admin, {"url": receiver.url, "events": ["key.leaked", "key.updated"]}
    )
    leaked = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    kept = await create_creds(client, admin, {"name": "kept", "roles": ["developer"]})
    # Warm: the leaked key's credentials are cached and proven before the report.
    for _ in range(2):
        await assert_ok(await client.get("/v1/whoami", headers=leaked.headers))

    await _revoke(client, leaked.secret, **{"User-Agent": "finder/1.0"})

    refused = await client.get("/v1/whoami", headers=leaked.headers)
    await assert_error(refused, 401, "key is disabled")
    assert await _state(client, admin, leaked.id) == "disabled"
    await assert_ok(await client.get("/v1/whoami", headers=kept.headers))
    assert await _state(client, admin, kept.id) == "enabled"

    records = [a for a in await listed(client, admin) if a.get("targetKeyId") == leaked.id]
    leak = [a for a in records if a["type"] == "key_leaked"]
    assert len(leak) == 1
    assert leak[0]["after"] == {
        "reporter": "revoke-leaked", "action": "disabled", "credential": "current",
    }  # fmt: skip
    assert leak[0]["actorType"] == "system"
    assert leak[0]["actorIpAddress"] == "127.0.0.1"
    assert [a["keyUpdateType"] for a in records if a["type"] == "openapi_key_update"] == [
        "state-changed"
    ]
    received = await receiver.wait_for(lambda got: len(got) >= 2)
    by_type = {r.event["type"]: r.event for r in received}
    assert set(by_type) == {"key.leaked", "key.updated"}
    assert by_type["key.leaked"]["data"]["id"] == leaked.id
    assert by_type["key.leaked"]["data"]["state"] == "disabled"
    for request in received:
        assert leaked.secret not in request.body.decode()

    # The same secret again: the same answer, nothing more recorded or sent.
    await _revoke(client, leaked.secret)
    again = [a for a in await listed(client, admin) if a.get("targetKeyId") == leaked.id]
    assert again == records
    await asyncio.sleep(0.5)
    assert len(receiver.received) == 2
    log = await deliveries(client, admin, hook["webhook"]["id"])
    assert sorted(d["eventType"] for d in log) == ["key.leaked", "key.updated"]

    assert audit_verdict(settings).problem is None


async def test_a_miss_answers_the_same_and_changes_nothing(
    client: Client, admin: Creds, settings: Settings
) -> None:
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    before = await listed(client, admin)
    hit = await _revoke(client, made.secret)
    missed = await _revoke(client, MISS)
    missed_plain = await _revoke(client, "not a keysvc secret at all")
    for body in (missed, missed_plain):
        assert body.keys() == hit.keys() and body["result"] == hit["result"]
    after = await listed(client, admin)
    assert len(after) == len(before) + 2  # the hit's state change and its report only
    await assert_ok(await client.get("/v1/whoami", headers=admin.headers))
    assert audit_verdict(settings).problem is None


async def test_previous_secret_within_grace_counts(client: Client, admin: Creds) -> None:
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    url = f"/v1/organizations/{admin.organization_id}/keys/{made.id}/rotate"
    await assert_ok(
        await client.post(url, json={"gracePeriodSeconds": 3600}, headers=admin.headers)
    )
    await _revoke(client, made.secret)
    assert await _state(client, admin, made.id) == "disabled"
    leak = [a for a in await listed(client, admin) if a["type"] == "key_leaked"]
    assert leak[0]["after"]["credential"] == "previous"


async def test_a_hash_data_key_is_found_by_its_own_secret(client: Client, admin: Creds) -> None:
    body = {"name": "own", "roles": ["developer"], "hashData": hash_data("own-id-1", "own-secret")}
    made = await create(client, admin, body)
    await _revoke(client, "own-secret")
    assert await _state(client, admin, made["key"]["id"]) == "disabled"


async def test_notify_leaves_the_key_enabled(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await private_client(aiohttp_client, settings, clock, leaked_key_action="notify")
    admin = await bootstrap(client.app)
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    await _revoke(client, made.secret)
    await _revoke(client, made.secret)
    assert await _state(client, admin, made.id) == "enabled"
    await assert_ok(await client.get("/v1/whoami", headers=made.headers))
    leak = [a for a in await listed(client, admin) if a["type"] == "key_leaked"]
    assert [a["after"]["action"] for a in leak] == ["notified"]


async def test_malformed_reports_are_refused(client: Client, admin: Creds) -> None:
    for body, message in (
        ({}, "secret: is required"),
        ({"secret": ""}, "secret: must be 1 to 4096 characters"),
        ({"secret": 7}, "secret: must be a string"),
        ({"secret": "x" * 4097}, "secret: must be 1 to 4096 characters"),
        ({"secret": MISS, "other": 1}, "other: is not a known field"),
    ):
        await assert_error(await client.post(REVOKE, json=body), 400, message)
    response = await client.post(REVOKE, data=b"{", headers={"Content-Type": "application/json"})
    await assert_error(
        response,
        400,
        "body: invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes",
    )
    await assert_ok(await client.get("/v1/whoami", headers=admin.headers))


async def test_reports_are_throttled_like_failed_logins(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await private_client(aiohttp_client, settings, clock, auth_failures=3)
    admin = await bootstrap(client.app)
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    for _ in range(3):
        await _revoke(client, MISS)
    # A hit now is refused like the misses before it: nothing tells them apart.
    refused = await client.post(REVOKE, json={"secret": made.secret})
    retry = refused.headers["Retry-After"]
    assert 1 <= int(retry) <= 60
    await assert_error(
        refused, 429, f"too many failed authentications from this address: retry in {retry} s"
    )
    # As a failed login would, the reports block the network's logins too, for the minute.
    assert (await client.get("/v1/whoami", headers=admin.headers)).status == 429
    clock.advance(seconds=61)
    assert await _state(client, admin, made.id) == "enabled"
    await _revoke(client, made.secret)
    assert await _state(client, admin, made.id) == "disabled"
