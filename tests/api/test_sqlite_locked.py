"""A write that finds SQLite's write lock held by another connection for all of the busy
timeout is refused 503 with Retry-After, nothing written: it was a 500, "internal server
error", with the driver's "database is locked" in the log (rt52 F2)."""

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from keysvc.config import Settings
from keysvc.db.sqlite.connections import BUSY_TIMEOUT_MS
from keysvc.db.sqlite.diskspace import LOCKED
from keysvc.http.state import SETTINGS, STORE
from tests.api.importing import record
from tests.helpers import Client, Creds, FakeClock, assert_error, create_creds, keys_url

pytestmark = pytest.mark.sqlite_only


@contextmanager
def held(settings: Settings) -> Iterator[None]:
    """The database's write lock, held by a connection of its own (as another process
    would hold it) until the block ends."""
    conn = sqlite3.connect(settings.db_path, isolation_level=None)
    try:
        conn.execute("begin exclusive")
        yield
        conn.execute("rollback")
    finally:
        conn.close()


async def test_a_write_under_another_connections_lock_is_a_503(
    client: Client, admin: Creds, settings: Settings, clock: FakeClock
) -> None:
    dev = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    assert (await client.get("/v1/verify", headers=dev.headers)).status == 200
    with held(settings):
        created = await client.post(
            keys_url(admin),
            json={"name": "x", "roles": ["developer"]},
            headers=admin.headers,
        )
        await assert_error(created, 503, LOCKED)
        assert created.headers["Retry-After"] == "5"
        # A verify in a new minute writes the key's usedAt: refused the same way.
        clock.advance(minutes=1)
        verified = await client.get("/v1/verify", headers=dev.headers)
        await assert_error(verified, 503, LOCKED)
    listed = await client.get(keys_url(admin), headers=admin.headers)
    names = [key["name"] for key in (await listed.json())["result"]]
    assert "x" not in names  # nothing was written
    assert (await client.get("/v1/verify", headers=dev.headers)).status == 200


async def test_writes_queued_under_the_lock_are_refused_together(
    client: Client, admin: Creds, settings: Settings
) -> None:
    """Four writes waiting for the process's turn while the first waits out the busy
    timeout are refused with it, not one timeout after another: the fourth was answered
    after some 20 s (rt53 R1)."""
    keys = [
        await create_creds(client, admin, {"name": f"k{n}", "roles": ["developer"]})
        for n in range(4)
    ]

    async def rename(key: Creds) -> tuple[int, float]:
        started = time.monotonic()
        path = keys_url(admin, key.id)
        answer = await client.patch(path, json={"name": "renamed"}, headers=admin.headers)
        await assert_error(answer, 503, LOCKED)
        return answer.status, time.monotonic() - started

    with held(settings):
        answers = await asyncio.gather(*(rename(key) for key in keys))
    assert max(seconds for _, seconds in answers) < BUSY_TIMEOUT_MS / 1000 + 2.5, answers
    listed = await client.get(keys_url(admin), headers=admin.headers)
    assert "renamed" not in [key["name"] for key in (await listed.json())["result"]]


async def _refused_after(started: float, answer: Any) -> float:
    await assert_error(answer, 503, LOCKED)
    return time.monotonic() - started


async def test_creates_and_spends_queued_under_the_lock_are_refused_with_it(
    client: Client, admin: Creds, settings: Settings
) -> None:
    """A rename waits out the busy timeout; creates and credit verifies that arrive
    meanwhile take their turns after it as batches, and are refused with it rather than
    each batch waiting the timeout again: they were answered after about two timeouts
    (rt54 S1)."""
    first = await create_creds(client, admin, {"name": "k", "roles": ["developer"]})
    spenders = [
        await create_creds(
            client, admin, {"name": f"s{n}", "roles": ["developer"], "credits": {"remaining": 5}}
        )
        for n in range(2)
    ]
    for spender in spenders:  # warm: their credentials cached, as a live key's are
        assert (await client.get("/v1/verify", headers=spender.headers)).status == 200
    started = time.monotonic()

    async def rename() -> float:
        path = keys_url(admin, first.id)
        return await _refused_after(
            started, await client.patch(path, json={"name": "r"}, headers=admin.headers)
        )

    async def create(n: int) -> float:
        await asyncio.sleep(0.3)  # behind the rename, which holds the process's turn
        body = {"name": f"new{n}", "roles": ["developer"]}
        return await _refused_after(
            started, await client.post(keys_url(admin), json=body, headers=admin.headers)
        )

    async def spend(key: Creds) -> float:
        await asyncio.sleep(0.3)
        return await _refused_after(started, await client.get("/v1/verify", headers=key.headers))

    with held(settings):
        answers = await asyncio.gather(
            rename(), *(create(n) for n in range(3)), *(spend(key) for key in spenders)
        )
    assert max(answers) < BUSY_TIMEOUT_MS / 1000 + 2.5, answers
    listed = await client.get(keys_url(admin), headers=admin.headers)
    assert not {"r", "new0", "new1", "new2"} & {
        key["name"] for key in (await listed.json())["result"]
    }
    for spender in spenders:  # nothing was spent: 5, less the warm verify and this one
        answer = await client.get(
            "/v1/verify", headers={**spender.headers, "Accept": "application/json"}
        )
        assert (await answer.json())["result"]["credits"]["remaining"] == 3


async def test_a_background_write_refused_by_the_lock_logs_no_traceback(
    client: Client, admin: Creds, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The record of a disabled key's use, written off the request's path, meets the
    lock: one warning line that says why, no traceback (it was logged with one, at
    error level, for each failed try: rt53 R2)."""
    key = await create_creds(client, admin, {"name": "gone", "roles": ["developer"]})
    path = keys_url(admin, key.id)
    assert (
        await client.patch(path, json={"state": "disabled"}, headers=admin.headers)
    ).status == 200
    with held(settings), caplog.at_level(logging.INFO, logger="keysvc"):
        assert (await client.get("/v1/verify", headers=key.headers)).status == 401
        for _ in range(80):  # the record's write waits out the busy timeout
            lines = [r for r in caplog.records if "revoked key" in r.getMessage()]
            if lines:
                break
            await asyncio.sleep(0.1)
    assert [(r.levelno, r.exc_info) for r in lines] == [(logging.WARNING, None)], lines
    assert LOCKED in lines[0].getMessage()


@pytest.mark.settings(api_token_import=True)
async def test_imports_of_one_organization_queued_under_the_lock_are_refused_with_it(
    client: Client, admin: Creds
) -> None:
    """Three imports into one organization at once wait for its turn in order; the first
    waits out the busy timeout, and the two behind it are refused with it rather than
    one timeout after another: the third was answered after some 15 s (rt54 S2)."""
    started = time.monotonic()

    async def one(n: int) -> float:
        body = {"keys": [record(f"held-{n}")]}
        answer = await client.post(keys_url(admin) + "/import", json=body, headers=admin.headers)
        return await _refused_after(started, answer)

    with held(client.app[SETTINGS]):
        answers = await asyncio.gather(*(one(n) for n in range(3)))
    assert max(answers) < BUSY_TIMEOUT_MS / 1000 + 2.5, answers


async def test_a_spend_waits_on_its_thread_for_a_lock_held_briefly(
    client: Client, admin: Creds, settings: Settings
) -> None:
    """A spend batch whose begin finds the write lock held waits for it on the batch's
    thread, within the busy timeout, and is answered once it is let go; the loop goes on
    meanwhile: its own begin never waits (the batch connection's busy timeout is 0 but
    around the thread's begin)."""
    spender = await create_creds(
        client, admin, {"name": "s", "roles": ["developer"], "credits": {"remaining": 5}}
    )
    assert (await client.get("/v1/verify", headers=spender.headers)).status == 200
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.ensure_future(tick())
    try:
        with held(settings):
            answer = asyncio.ensure_future(
                client.get("/v1/verify", headers={**spender.headers, "Accept": "application/json"})
            )
            await asyncio.sleep(0.6)
            assert not answer.done()
        response = await answer
        assert response.status == 200
        assert (await response.json())["result"]["credits"]["remaining"] == 3
    finally:
        ticker.cancel()
    assert max(gaps) < 0.3, max(gaps)  # the loop never waited for the lock
    batch_conn = client.app[STORE]._creates.thread._conn
    assert batch_conn.execute("pragma busy_timeout").fetchone()[0] == 0
