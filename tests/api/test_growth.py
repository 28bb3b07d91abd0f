"""What one organization can make the shared database hold: the write budget and the
webhook queue limit under the PATCH flood (two 100-entry IP lists in turn, 20 webhooks
to a closed port), the activity page bounded in bytes, the date filter served by an
index, the activity retention that `keysvc audit verify` still passes after, and a
create batch where one organization over its budget fails only its own creates."""

import asyncio
import logging
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from keysvc.config import Settings
from keysvc.db.activities import COUNT, PAGE_DATED
from keysvc.db.backends import verify_audit
from keysvc.db.dialect import Sql, postgres_text
from keysvc.http.state import STORE
from tests.api.activities import listed, url
from tests.api.webhooks import create_webhook, private_client
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    bootstrap,
    client_with,
    closed_port,
    create,
    ip_list,
)

FLOOD_PATCHES = 200
# Half of what the flood grew a file by with no limits.
GROWTH_BOUND = 68_000_000


def stored_bytes(settings: Settings) -> int:
    path = settings.db_path
    files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
    return sum(f.stat().st_size for f in files if f.exists())


async def flooding(client: Client, admin: Creds) -> str:
    """An organization with 20 webhooks to a closed loopback port and a key; its URL."""
    target = f"http://127.0.0.1:{closed_port()}/hook"
    for _ in range(20):
        await create_webhook(client, admin, {"url": target, "events": ["key.updated"]})
    made = await create(client, admin, {"name": "flood", "roles": ["developer"]})
    return f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"


async def test_the_patch_flood_is_refused_part_way_under_the_default_limits(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, backend: str
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    key_url = await flooding(client, admin)
    before = stored_bytes(settings)
    refusal: dict[str, Any] | None = None
    for n in range(FLOOD_PATCHES):
        body = {"ipAccessList": ip_list("ab"[n % 2])}
        response = await client.patch(key_url, json=body, headers=admin.headers)
        if response.status != 200:
            refusal = await response.json()
            assert response.status == 429, refusal
            assert int(response.headers["Retry-After"]) >= 1
            break
    assert refusal is not None, "200 PATCHes went through"
    assert "write budget" in refusal["error"], refusal
    assert "KEYSVC_ORG_WRITE_BUDGET_MIB" in refusal["error"], refusal
    if backend == "sqlite":
        assert stored_bytes(settings) - before <= GROWTH_BOUND
    # Reads still answer, and a write that stores nothing new is not what is refused.
    await assert_ok(await client.get(url(admin), headers=admin.headers))


async def test_a_webhook_with_its_queue_full_refuses_the_writes_that_would_add_to_it(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await private_client(aiohttp_client, settings, clock, webhook_queue_limit=3)
    admin = await bootstrap(client.app)
    target = f"http://127.0.0.1:{closed_port()}/hook"
    hook = await create_webhook(client, admin, {"url": target, "events": ["key.updated"]})
    made = await create(client, admin, {"name": "q", "roles": ["developer"]})
    key_url = f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"
    for n in range(3):
        response = await client.patch(key_url, json={"name": f"q{n}"}, headers=admin.headers)
        await assert_ok(response)
    response = await client.patch(key_url, json={"name": "q4"}, headers=admin.headers)
    body = await response.json()
    assert response.status == 429, body
    assert body["error"] == (
        f"webhook {hook['webhook']['id']} has 3 deliveries waiting, its queue limit"
        " (KEYSVC_WEBHOOK_QUEUE_LIMIT); fix its receiver or delete it, or try again later"
    )
    assert int(response.headers["Retry-After"]) >= 1


async def test_an_activity_page_stops_at_its_byte_bound_with_a_cursor(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await private_client(aiohttp_client, settings, clock, activity_page_bytes=65536)
    admin = await bootstrap(client.app)
    made = await create(client, admin, {"name": "big", "roles": ["developer"]})
    key_url = f"/v1/organizations/{admin.organization_id}/keys/{made['key']['id']}"
    for n in range(12):
        body = {"ipAccessList": ip_list("ab"[n % 2])}
        await assert_ok(await client.patch(key_url, json=body, headers=admin.headers))
    seen: list[str] = []
    cursor = ""
    pages = 0
    while True:
        response = await client.get(url(admin, f"?limit=250{cursor}"), headers=admin.headers)
        text = await response.text()
        page = await response.json()
        assert response.status == 200, page
        pages += 1
        assert len(page["result"]) == 1 or len(text.encode()) <= 65536 + 4096, len(text)
        seen += [record["id"] for record in page["result"]]
        if page["nextCursor"] is None:
            break
        cursor = f"&cursor={page['nextCursor']}"
    assert pages > 2
    assert len(seen) == len(set(seen)) == 12 + 2  # two creates and the 12 changes


async def test_a_date_filtered_page_and_its_count_read_the_time_index(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, backend: str
) -> None:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    await create(client, admin, {"name": "dated", "roles": ["developer"]})
    found = await assert_ok(
        await client.get(url(admin, "?from_date=2000-01-01T00:00:00Z"), headers=admin.headers)
    )
    assert len(found) == 2  # the bootstrap admin key and this one
    kinds = ('["key_create"]', '["created"]')
    page_params = (
        admin.organization_id,
        0,
        "2026-01-01",
        "2026-01-02",
        kinds[0],
        kinds[0],
        kinds[1],
        251,
    )
    count_params = (admin.organization_id, "2026-01-01", "2026-01-02", kinds[0], kinds[0], kinds[1])
    if backend == "sqlite":
        for sql, params in ((PAGE_DATED, page_params), (COUNT, count_params)):
            plan = sqlite_plan(settings.db_path, str(sql), params)
            assert "USING COVERING INDEX activities_org_time" in plan or (
                "USING INDEX activities_org_time" in plan
            ), plan
            assert "SCAN activities" not in plan.replace("USING", ""), plan
    else:
        assert settings.db_url is not None
        for sql, params in ((PAGE_DATED, page_params), (COUNT, count_params)):
            plan = await postgres_plan(settings.db_url, sql, params)
            assert "activities_org_time" in plan, plan


def sqlite_plan(path: Path, sql: str, params: tuple[object, ...]) -> str:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("explain query plan " + sql, params).fetchall()
    return " | ".join(str(row[-1]) for row in rows)


async def postgres_plan(db_url: str, sql: Sql, params: tuple[object, ...]) -> str:
    """The plan PostgreSQL picks for a large organization's log."""
    conn = await asyncpg.connect(db_url)
    try:
        async with conn.transaction():
            await conn.execute(_MANY_RECORDS, params[0])
            await conn.execute("analyze activities")
            rows = await conn.fetch("explain " + postgres_text(sql), *params)
            raise _Undone
    except _Undone:
        pass
    finally:
        await conn.close()
    return " | ".join(row[0] for row in rows)


class _Undone(Exception):
    """Rolls the plan's records back."""


# Records enough for PostgreSQL's statistics to tell a date filter's few from the
# organization's many, a year of them, rolled back once planned (never verified).
_MANY_RECORDS = """
    insert into activities (id, organization_id, org_seq, created_at, type, actor_type,
                            prev_hash, hash)
    select gen_random_uuid()::text, $1, 1000 + n,
           to_char(timestamp '2025-01-01' + n * interval '5 minutes',
                   'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
           'key_create', 'system', '\\x00'::bytea, '\\x00'::bytea
    from generate_series(1, 100000) as n
"""


async def test_retention_prunes_old_activities_and_audit_verify_still_passes(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    backend: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock.advance(days=-10)
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    old = await create(client, admin, {"name": "old", "roles": ["developer"]})
    old_url = f"/v1/organizations/{admin.organization_id}/keys/{old['key']['id']}"
    await assert_ok(await client.patch(old_url, json={"name": "old-2"}, headers=admin.headers))
    clock.advance(days=10)
    await assert_ok(await client.patch(old_url, json={"name": "old-3"}, headers=admin.headers))
    everything = await listed(client, admin)
    unpruned = await asyncio.to_thread(verify_audit, settings)
    assert unpruned.problem is None
    # A server with a retention of 5 days prunes the two records from 10 days ago.
    pruning = await private_client(aiohttp_client, settings, clock, activity_retention_days=5)
    cutoff = (clock.now - timedelta(days=5)).isoformat()
    recent = [a["id"] for a in everything if a["createdAt"] >= cutoff]
    kept: list[str] = []
    for _ in range(100):
        kept = [a["id"] for a in await listed(pruning, admin)]
        if kept == recent:
            break
        await asyncio.sleep(0.1)
    assert kept == recent, (everything, kept)
    # Pruned by the upkeep's first round, which nothing failed.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    pruned = len(everything) - len(recent)
    assert pruned >= 2
    verdict = await asyncio.to_thread(verify_audit, settings)
    assert verdict.problem is None, verdict
    assert verdict.records == unpruned.records - pruned
    # The key's later change still replays onto what the pruned records left.
    await assert_ok(await pruning.patch(old_url, json={"name": "old-4"}, headers=admin.headers))
    again = await asyncio.to_thread(verify_audit, settings)
    assert again.problem is None, again
    if backend == "sqlite":
        with sqlite3.connect(settings.db_path) as conn:
            conn.execute("update activity_anchors set first_seq = first_seq - 1")
        tampered = await asyncio.to_thread(verify_audit, settings)
        assert "anchor" in str(tampered.problem), tampered


# A create whose activity record weighs some 30 KB of the write budget.
BIG_CREATE = {"name": "big", "roles": ["developer"], "ipAccessList": ip_list("a")}


async def over_budget(client: Client, admin: Creds) -> None:
    """Create keys with long IP lists in ``admin``'s organization until its write budget
    refuses one (429): the budget has no room left for another such create."""
    keys_url = f"/v1/organizations/{admin.organization_id}/keys"
    for _ in range(FLOOD_PATCHES):
        response = await client.post(keys_url, json=BIG_CREATE, headers=admin.headers)
        if response.status == 429:
            return
        await assert_ok(response)
    raise AssertionError(f"{FLOOD_PATCHES} creates went through")


def batches_of_orgs(client: Client, monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The organizations of each SQLite create batch written from now on."""
    batches: list[set[str]] = []
    thread = client.app[STORE]._creates.thread
    run = thread.run

    async def noted(batch: list[Any]) -> Any:
        batches.append({item[0].organization_id for item in batch})
        return await run(batch)

    monkeypatch.setattr(thread, "run", noted)
    return batches


async def test_an_organization_over_its_budget_fails_only_its_own_creates_in_a_batch(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = await client_with(aiohttp_client, settings, clock, org_write_budget_mib=1)
    flooder = await bootstrap(client.app, "flooder")
    other = await bootstrap(client.app, "other")
    await over_budget(client, flooder)
    batches = batches_of_orgs(client, monkeypatch) if backend == "sqlite" else []
    small = {"name": "small", "roles": ["developer"]}
    for _ in range(20):
        callers = [flooder, other] * 4
        responses = await asyncio.gather(
            *(
                client.post(
                    f"/v1/organizations/{c.organization_id}/keys",
                    json=BIG_CREATE if c is flooder else small,
                    headers=c.headers,
                )
                for c in callers
            )
        )
        for caller, response in zip(callers, responses, strict=True):
            body = await response.json()
            if caller is other:
                assert response.status == 200, body
            else:
                assert response.status == 429, body
                assert "KEYSVC_ORG_WRITE_BUDGET_MIB" in body["error"], body
        # On SQLite, until a batch held both organizations' creates.
        if backend != "sqlite" or any(len(orgs) == 2 for orgs in batches):
            break
    else:
        raise AssertionError(f"no batch held both organizations' creates: {batches}")
