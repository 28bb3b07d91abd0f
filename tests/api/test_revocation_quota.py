"""Revocation that no quota can refuse, on both backends: a key that has spent its
organization's write budget, or filled a webhook's queue, cannot block its own disable,
delete or report as leaked (``keysvc.db.quota``); ordinary writes are still refused,
the budget still counts the revocations, and their events take the queue's reserve,
then are dropped with a logged note. A GitHub report's tokens are acted on each alone."""

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.db.quota import DROPPED, reserve_of
from keysvc.http.state import LEAK_REPORTS
from keysvc.scanning import load_keys
from tests.api.activities import listed
from tests.api.scanning import SCANNING, GitHubSigner, report
from tests.api.webhooks import create_webhook, deliveries, private_client
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    closed_port,
    create_creds,
    get_key,
    hash_data,
    ip_list,
    keys_url,
)
from tests.receiver import Receiver

REVOKE = "/v1/keys/revoke-leaked"
BUDGET_REFUSAL = (
    "organization {} has used its write budget of 1 MiB of activities and webhook deliveries"
    " this hour (KEYSVC_ORG_WRITE_BUDGET_MIB); try again when the hour ends"
)
QUEUE_REFUSAL = (
    "webhook {} has 2 deliveries waiting, its queue limit (KEYSVC_WEBHOOK_QUEUE_LIMIT); fix"
    " its receiver or delete it, or try again later"
)
QUEUE_LIMIT = 2


async def _state(client: Client, admin: Creds, key_id: str) -> str:
    state: str = (await get_key(client, admin, key_id))["state"]
    return state


async def _revoke(client: Client, secret: str) -> None:
    response = await client.post(REVOKE, json={"secret": secret})
    assert (await assert_ok(response)) == {"status": "received"}
    await client.app[LEAK_REPORTS].work_through()


async def _dead_webhook(client: Client, admin: Creds) -> dict[str, Any]:
    """A webhook of the revocations' events to a closed port: its deliveries wait."""
    body = {"url": f"http://127.0.0.1:{closed_port()}/hook",
            "events": ["key.updated", "key.deleted", "key.leaked"]}  # fmt: skip
    return await create_webhook(client, admin, body)


async def _spend_the_budget(client: Client, leaked: Creds, victim: str) -> None:
    """The leaked key PATCHes a key's IP access list, then its own name, until the
    budget refuses even a rename."""
    for url, bodies in (
        (keys_url(leaked, victim), [{"ipAccessList": ip_list("ab"[n % 2])} for n in range(200)]),
        (keys_url(leaked, leaked.id), [{"name": f"name{n % 10}"} for n in range(2000)]),
    ):
        for body in bodies:
            response = await client.patch(url, json=body, headers=leaked.headers)
            if response.status == 429:
                await assert_error(response, 429, BUDGET_REFUSAL.format(leaked.organization_id))
                break
            await assert_ok(response)
        else:
            raise AssertionError("the budget never refused the flood")


async def test_a_key_past_the_write_budget_cannot_block_its_own_revocation(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await private_client(aiohttp_client, settings, clock, org_write_budget_mib=1)
    admin = await bootstrap(client.app)
    hook = await _dead_webhook(client, admin)
    leaked = await create_creds(client, admin, {"name": "leaked", "roles": ["admin"]})
    victim = await create_creds(client, admin, {"name": "victim", "roles": ["developer"]})
    other = await create_creds(client, admin, {"name": "other", "roles": ["developer"]})
    third = await create_creds(client, admin, {"name": "third", "roles": ["developer"]})
    await _spend_the_budget(client, leaked, victim.id)

    # An ordinary write of the owner's is refused: the budget still holds.
    rename = await client.patch(
        keys_url(admin, other.id), json={"name": "renamed"}, headers=admin.headers
    )
    await assert_error(rename, 429, BUDGET_REFUSAL.format(admin.organization_id))
    # The owner's revocations all go through, each at once.
    disabled = await client.patch(
        keys_url(admin, leaked.id), json={"state": "disabled"}, headers=admin.headers
    )
    assert (await assert_ok(disabled))["state"] == "disabled"
    await assert_error(await client.get("/v1/whoami", headers=leaked.headers), 401,
                       "key is disabled")  # fmt: skip
    deleted = await client.delete(keys_url(admin, other.id), headers=admin.headers)
    await assert_ok(deleted)
    await _revoke(client, third.secret)
    assert await _state(client, admin, third.id) == "disabled"
    # A disable sent with other changes is still a revocation.
    both = await client.patch(
        keys_url(admin, victim.id), json={"state": "disabled", "name": "gone"},
        headers=admin.headers,
    )  # fmt: skip
    assert (await assert_ok(both))["state"] == "disabled"
    # Their events were queued, and their bytes counted: re-enabling is refused.
    sent = {d["eventType"] for d in await deliveries(client, admin, hook["webhook"]["id"])}
    assert {"key.updated", "key.deleted", "key.leaked"} <= sent
    enable = await client.patch(
        keys_url(admin, leaked.id), json={"state": "enabled"}, headers=admin.headers
    )
    await assert_error(enable, 429, BUDGET_REFUSAL.format(admin.organization_id))


async def test_a_full_queue_cannot_block_a_revocation(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = await private_client(aiohttp_client, settings, clock, webhook_queue_limit=QUEUE_LIMIT)
    admin = await bootstrap(client.app)
    hook = await _dead_webhook(client, admin)
    hook_id = hook["webhook"]["id"]
    leaked = await create_creds(client, admin, {"name": "leaked", "roles": ["admin"]})
    spare = [
        await create_creds(client, admin, {"name": f"spare{n}", "roles": ["developer"]})
        for n in range(3)
    ]
    for n in range(QUEUE_LIMIT):
        renamed = await client.patch(
            keys_url(leaked, spare[0].id), json={"name": f"n{n}"}, headers=leaked.headers
        )
        await assert_ok(renamed)
    refused = await client.patch(
        keys_url(admin, spare[0].id), json={"name": "again"}, headers=admin.headers
    )
    await assert_error(refused, 429, QUEUE_REFUSAL.format(hook_id))

    # The disable takes the reserve (one place at this limit)...
    assert reserve_of(QUEUE_LIMIT) == 1
    disabled = await client.patch(
        keys_url(admin, leaked.id), json={"state": "disabled"}, headers=admin.headers
    )
    assert (await assert_ok(disabled))["state"] == "disabled"
    waiting = await deliveries(client, admin, hook_id)
    assert [d["eventType"] for d in waiting].count("key.updated") == QUEUE_LIMIT + 1
    # ...then the delete and the report go through without their events, each noted.
    caplog.clear()
    dropped = DROPPED.count
    with caplog.at_level(logging.WARNING, logger="keysvc"):
        await assert_ok(await client.delete(keys_url(admin, spare[1].id), headers=admin.headers))
        await _revoke(client, spare[2].secret)
    assert await _state(client, admin, spare[2].id) == "disabled"
    notes = [r.getMessage() for r in caplog.records if "not queued" in r.getMessage()]
    assert len(notes) == 3, notes  # the delete's; the report's disable and its key.leaked
    assert all(hook_id in note for note in notes)
    assert DROPPED.count == dropped + 3
    assert len(await deliveries(client, admin, hook_id)) == QUEUE_LIMIT + 1


async def test_one_tenants_full_queue_does_not_touch_another_tenants_report(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    signer = GitHubSigner()
    client = await private_client(
        aiohttp_client, settings, clock, webhook_queue_limit=1,
        github_scanning_keys=load_keys(signer.write(tmp_path / "github-keys.json")),
    )  # fmt: skip
    full, other = await bootstrap(client.app, "full"), await bootstrap(client.app, "other")
    hook = await create_webhook(
        client, full, {"url": f"http://127.0.0.1:{closed_port()}/hook",
                       "events": ["key.updated", "key.leaked"]},
    )  # fmt: skip
    first = await create_creds(client, full, {"name": "a", "roles": ["developer"]})
    await assert_ok(
        await client.patch(keys_url(full, first.id), json={"name": "b"}, headers=full.headers)
    )
    second = await create_creds(client, full, {"name": "c", "roles": ["developer"]})
    theirs = await create_creds(client, other, {"name": "d", "roles": ["developer"]})
    body = report(first.secret, second.secret, theirs.secret)
    headers = {**signer.headers(body), "Content-Type": "application/json"}
    response = await client.post(SCANNING, data=body, headers=headers)
    text = await response.text()
    assert response.status == 200, text
    assert [e["label"] for e in await response.json()] == ["true_positive"] * 3
    for named in (hook["webhook"]["id"], full.organization_id, other.organization_id):
        assert named not in text
    for creds, key in ((full, first), (full, second), (other, theirs)):
        assert await _state(client, creds, key.id) == "disabled"


@pytest.mark.parametrize("sharing", [17, 40])
async def test_every_key_sharing_a_secret_is_disabled(
    client: Client, admin: Creds, sharing: int
) -> None:
    made = []
    for n in range(sharing):
        body = {"name": f"k{n}", "roles": ["developer"],
                "hashData": hash_data(f"shared-id-{n:04d}", "one-shared-secret")}  # fmt: skip
        response = await client.post(keys_url(admin), json=body, headers=admin.headers)
        made.append((await assert_ok(response))["key"]["id"])
    await _revoke(client, "one-shared-secret")
    states = [await _state(client, admin, key_id) for key_id in made]
    assert states == ["disabled"] * sharing
    leaks = await _leak_records(client, admin)
    assert sorted(a["targetKeyId"] for a in leaks) == sorted(made)


async def _leak_records(client: Client, admin: Creds) -> list[dict[str, Any]]:
    return [a for a in await listed(client, admin) if a["type"] == "key_leaked"]


async def test_a_rotation_that_kept_the_secret_is_reported_once(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    receiver = await Receiver().start()
    try:
        client = await private_client(aiohttp_client, settings, clock)
        admin = await bootstrap(client.app)
        await create_webhook(
            client, admin, {"url": receiver.url, "events": ["key.updated", "key.leaked"]}
        )
        body = {"name": "own", "roles": ["developer"],
                "hashData": hash_data("own-id-0001", "kept-secret")}  # fmt: skip
        made = await assert_ok(await client.post(keys_url(admin), json=body, headers=admin.headers))
        key_id = made["key"]["id"]
        rotate = {"gracePeriodSeconds": 3600, "hashData": hash_data("own-id-0002", "kept-secret")}
        await assert_ok(
            await client.post(keys_url(admin, key_id) + "/rotate", json=rotate,
                              headers=admin.headers)
        )  # fmt: skip
        await _revoke(client, "kept-secret")
        records = [a for a in await listed(client, admin) if a.get("targetKeyId") == key_id]
        assert [a["type"] for a in records].count("key_leaked") == 1
        states = [a for a in records if a.get("keyUpdateType") == "state-changed"]
        assert len(states) == 1
        await receiver.wait_for(lambda r: len(r) >= 2)
        await asyncio.sleep(1.5)  # time for a second pair, were one queued
        assert sorted(r.event["type"] for r in receiver.received) == ["key.leaked", "key.updated"]
    finally:
        await receiver.stop()


@pytest.mark.parametrize("blanks", ["{}\n", "{}\r\n", "  {}\t", "\n{}\n"])
async def test_a_pasted_secret_with_blanks_around_it_is_found(
    client: Client, admin: Creds, blanks: str
) -> None:
    made = await create_creds(client, admin, {"name": "ci", "roles": ["developer"]})
    await _revoke(client, blanks.format(made.secret))
    assert await _state(client, admin, made.id) == "disabled"
