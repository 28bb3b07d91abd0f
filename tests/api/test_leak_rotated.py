"""A leaked key that holds ``keys:update`` rotates itself with the leaked credentials (no
grace): a report of the published secret, now a secret the rotation replaced, is still
a hit, on both backends, through revoke-leaked's background work and GitHub's path
alike. It never disables the key (its owner may have rotated to rescue it), but it tells
the owner: a ``key_leaked`` activity and a ``key.leaked`` event that say the secret is
the key's previous one, replaced at the rotation, and that the key was left enabled;
GitHub's label is true_positive; a second report records nothing more."""

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.http.state import LEAK_REPORTS
from keysvc.scanning import load_keys
from tests.api.activities import listed
from tests.api.scanning import SCANNING, GitHubSigner, report
from tests.api.webhooks import create_webhook, private_client
from tests.handsql import audit_verdict, hand_sql
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    bootstrap,
    client_with,
    create_creds,
    create_role,
    get_key,
)
from tests.receiver import Receiver

REVOKE = "/v1/keys/revoke-leaked"


async def _self_rotated(client: Client, admin: Creds) -> tuple[Creds, Creds, str]:
    """A key holding keys:update that rotated itself with its own (leaked) credentials:
    the leaked ones, the new ones, and when the rotation answered."""
    role = await create_role(
        client, admin, {"name": "updater", "permissions": ["keys:update", "reports:read"]}
    )
    leaked = await create_creds(client, admin, {"name": "leaky", "assignedRoleIds": [role["id"]]})
    url = f"/v1/organizations/{admin.organization_id}/keys/{leaked.id}/rotate"
    rotated = await assert_ok(await client.post(url, json={}, headers=leaked.headers))
    fresh = Creds(admin.organization_id, leaked.id, rotated["keyId"], rotated["keySecret"])
    activities = await listed(client, admin)
    rotation = [a for a in activities if a.get("keyUpdateType") == "key-rotated"]
    # What the owner can watch for: the key rotated by itself.
    assert [(a["targetKeyId"], a["actorId"]) for a in rotation] == [(leaked.id, leaked.id)]
    return leaked, fresh, rotation[0]["createdAt"]


async def _report_by_api(client: Client, secret: str) -> None:
    response = await client.post(REVOKE, json={"secret": secret})
    assert response.status == 200
    assert (await response.json())["result"] == {"status": "received"}
    await client.app[LEAK_REPORTS].work_through()


async def _report_by_github(client: Client, signer: GitHubSigner, secret: str) -> list[str]:
    body = report(secret)
    response = await client.post(SCANNING, data=body, headers=signer.headers(body))
    assert response.status == 200, await response.text()
    return [entry["label"] for entry in json.loads(await response.text())]


@pytest.mark.parametrize("first", ["revoke-leaked", "github"])
async def test_a_report_of_a_self_rotated_keys_old_secret_tells_the_owner_and_keeps_the_key(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path,
    receiver: Receiver, first: str,
) -> None:  # fmt: skip
    signer = GitHubSigner()
    keys = load_keys(signer.write(tmp_path / "github-keys.json"))
    client = await private_client(aiohttp_client, settings, clock, github_scanning_keys=keys)
    admin = await bootstrap(client.app)
    await create_webhook(client, admin, {"url": receiver.url, "events": ["key.leaked"]})
    leaked, fresh, rotated_at = await _self_rotated(client, admin)

    if first == "github":
        assert await _report_by_github(client, signer, leaked.secret) == ["true_positive"]
    else:
        await _report_by_api(client, leaked.secret)

    # Never disabled: the key keeps working with its new secret.
    assert (await get_key(client, admin, leaked.id))["state"] == "enabled"
    await assert_ok(await client.get("/v1/whoami", headers=fresh.headers))
    records = await listed(client, admin)
    leak = [a for a in records if a["type"] == "key_leaked"]
    assert len(leak) == 1
    assert leak[0]["targetKeyId"] == leaked.id
    after: dict[str, Any] = leak[0]["after"]
    assert {k: after[k] for k in ("reporter", "action", "credential", "keyLeftEnabled")} == {
        "reporter": first, "action": "left enabled", "credential": "previous",
        "keyLeftEnabled": True,
    }  # fmt: skip
    assert after["replacedAt"][:19] == rotated_at[:19]
    received = await receiver.wait_for(lambda got: len(got) >= 1)
    assert [r.event["type"] for r in received] == ["key.leaked"]
    data = received[0].event["data"]
    assert data["id"] == leaked.id and data["state"] == "enabled"
    assert data["leakedSecret"] == {
        "credential": "previous", "replacedAt": after["replacedAt"], "keyLeftEnabled": True,
    }  # fmt: skip
    assert leaked.secret not in received[0].body.decode()

    # A second report, by the other path, and a third by the first: true_positive,
    # nothing more recorded or sent.
    assert await _report_by_github(client, signer, leaked.secret) == ["true_positive"]
    await _report_by_api(client, leaked.secret)
    assert [a for a in await listed(client, admin) if a["type"] == "key_leaked"] == leak
    assert (await get_key(client, admin, leaked.id))["state"] == "enabled"
    await asyncio.sleep(1.5)  # a delivery would be attempted within the retry second
    assert [r.event["type"] for r in receiver.received] == ["key.leaked"]
    assert audit_verdict(settings).problem is None


async def test_a_secret_two_rotations_back_is_found_until_its_tombstone_is_pruned(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, tmp_path: Path
) -> None:
    signer = GitHubSigner()
    keys = load_keys(signer.write(tmp_path / "github-keys.json"))
    client = await private_client(aiohttp_client, settings, clock, github_scanning_keys=keys)
    admin = await bootstrap(client.app)
    leaked, fresh, _ = await _self_rotated(client, admin)
    url = f"/v1/organizations/{admin.organization_id}/keys/{leaked.id}/rotate"
    await assert_ok(await client.post(url, json={}, headers=fresh.headers))
    assert await _report_by_github(client, signer, leaked.secret) == ["true_positive"]
    (leak,) = [a for a in await listed(client, admin) if a["type"] == "key_leaked"]
    assert leak["after"]["credential"] == "previous" and leak["after"]["keyLeftEnabled"]

    # Past the retention, the tombstone is pruned: a report then finds nothing.
    second = await create_creds(client, admin, {"name": "second", "roles": ["developer"]})
    await assert_ok(await client.post(
        f"/v1/organizations/{admin.organization_id}/keys/{second.id}/rotate", json={},
        headers=admin.headers,
    ))  # fmt: skip
    hand_sql(
        settings,
        "update deleted_credentials set deleted_at = '2000-01-01T00:00:00Z' where key_id = ?",
        second.id,
    )
    await client_with(aiohttp_client, settings, clock, usage_retention_days=30)
    for _ in range(400):
        if not hand_sql(settings, "select 1 from deleted_credentials where key_id = ?", second.id):
            break
        await asyncio.sleep(0.05)
    assert await _report_by_github(client, signer, second.secret) == ["false_positive"]
    assert [a["targetKeyId"] for a in await listed(client, admin) if a["type"] == "key_leaked"] == [
        leaked.id
    ]


@pytest.mark.sqlite_only  # the CLI reads the pepper file beside the database
async def test_the_cli_reports_a_self_rotated_keys_old_secret_and_keeps_the_key(
    client: Client, admin: Creds, settings: Settings
) -> None:
    leaked, fresh, _ = await _self_rotated(client, admin)
    command = [sys.executable, "-m", "keysvc", "revoke-leaked", "--db", str(settings.db_path)]
    for _ in range(2):
        done = await asyncio.to_thread(
            subprocess.run, command, input=leaked.secret + "\n", capture_output=True,
            text=True, timeout=60, check=False,
        )  # fmt: skip
        assert (done.returncode, json.loads(done.stdout)) == (0, {"matched": True}), done.stderr
    assert (await get_key(client, admin, leaked.id))["state"] == "enabled"
    await assert_ok(await client.get("/v1/whoami", headers=fresh.headers))
    (leak,) = [a for a in await listed(client, admin) if a["type"] == "key_leaked"]
    assert leak["after"]["reporter"] == "cli" and leak["after"]["action"] == "left enabled"
    assert leak["after"]["credential"] == "previous" and leak["after"]["keyLeftEnabled"]
