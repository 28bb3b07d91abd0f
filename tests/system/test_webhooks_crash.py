"""Webhook deliveries survive a crash: a real ``keysvc serve`` whose receiver answers
500 is killed with SIGKILL while every event is still pending; restarted as two
workers with the receiver answering, it delivers every event, signed, each once (no
two workers make the same attempt at once). A receiver that hangs does not hold up
SIGTERM, and what was being attempted is attempted again at the next start."""

import asyncio
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from keysvc.cli.serve import SHUTDOWN_SECONDS
from tests.helpers import Creds
from tests.receiver import Receiver, signature_valid
from tests.server import Server, admin_creds, bootstrap

ENV = {
    "KEYSVC_WEBHOOK_ALLOW_PRIVATE": "1",
    "KEYSVC_WEBHOOK_RETRY_SECONDS": "0.5",
    "KEYSVC_WEBHOOK_TIMEOUT": "5",
}


async def _call(
    session: aiohttp.ClientSession, method: str, url: str, admin: Creds,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    async with session.request(method, url, json=body, headers=admin.headers) as response:
        answer: dict[str, Any] = await response.json()
    assert response.status == 200, answer
    return answer


def _outbox(db: Path) -> list[tuple[str, str]]:
    """Each delivery's event ID and state, read straight from the database."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute("select event_id, state from webhook_deliveries").fetchall()
    finally:
        conn.close()


async def test_pending_deliveries_survive_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    receiver = await Receiver().start()
    receiver.status = 500
    org = f"/v1/organizations/{admin.organization_id}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            with Server(db, ENV) as server:
                body = {
                    "url": receiver.url,
                    "events": ["key.created", "key.updated", "key.deleted"],
                }
                created = await _call(session, "POST", server.base + org + "/webhooks", admin, body)
                secret, webhook_id = created["result"]["secret"], created["result"]["webhook"]["id"]
                made = []
                for n in range(4):
                    key = {"name": f"k{n}", "roles": ["developer"]}
                    made.append(
                        await _call(session, "POST", server.base + org + "/keys", admin, key)
                    )
                for answer in made[:2]:
                    url = f"{server.base}{org}/keys/{answer['result']['key']['id']}"
                    await _call(session, "PATCH", url, admin, {"name": "renamed"})
                url = f"{server.base}{org}/keys/{made[3]['result']['key']['id']}"
                await _call(session, "DELETE", url, admin)
                await receiver.wait_for(lambda got: len(got) >= 7)  # attempted, and failed
                server.stop(signal.SIGKILL)

            outbox = _outbox(db)
            assert len(outbox) == 7 and {state for _, state in outbox} == {"pending"}
            events = {event_id for event_id, _ in outbox}
            receiver.status = 204
            with Server(db, ENV, args=("--workers", "2")) as server:
                await receiver.wait_for(
                    lambda got: {r.event["id"] for r in got if r.status == 204} >= events,
                    timeout=120,
                )
                await asyncio.sleep(1)  # time for a second delivery, were one to be made
                url = f"{server.base}{org}/webhooks/{webhook_id}/deliveries"
                log = (await _call(session, "GET", url, admin))["result"]
    finally:
        await receiver.stop()

    assert all(signature_valid(secret, r) for r in receiver.received)
    delivered = Counter(r.event["id"] for r in receiver.received if r.status == 204)
    assert set(delivered) == events
    assert set(delivered.values()) == {1}
    assert Counter(r.event["type"] for r in receiver.received if r.status == 204) == {
        "key.created": 4, "key.updated": 2, "key.deleted": 1,
    }  # fmt: skip
    assert len(log) == 7
    for entry in log:
        assert entry["state"] == "delivered"
        assert entry["attempts"][-1]["status"] == 204
        assert all(a["status"] == 500 for a in entry["attempts"][:-1])


async def test_sigterm_stops_promptly_and_gives_back_what_it_was_attempting(
    tmp_path: Path,
) -> None:
    """A receiver that never answers, attempts allowed a minute: SIGTERM still stops the
    server within its shutdown time, and the deliveries it held are attempted again as
    soon as it restarts, not once their leases run out."""
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    receiver = await Receiver().start()
    receiver.hang = True
    org = f"/v1/organizations/{admin.organization_id}"
    env = {**ENV, "KEYSVC_WEBHOOK_TIMEOUT": "60"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            with Server(db, env) as server:
                body = {"url": receiver.url, "events": ["key.created"]}
                await _call(session, "POST", server.base + org + "/webhooks", admin, body)
                key = {"name": "k", "roles": ["developer"]}
                await _call(session, "POST", server.base + org + "/keys", admin, key)
                await receiver.wait_for(lambda got: len(got) >= 1)  # held, unanswered
                took = await asyncio.to_thread(server.stop, signal.SIGTERM, SHUTDOWN_SECONDS + 10)
                assert server.proc.returncode == 0, server.stderr_text()
            assert took < SHUTDOWN_SECONDS + 5
            receiver.hang = False
            receiver.release.set()
            started = time.monotonic()
            with Server(db, env):
                while {state for _, state in _outbox(db)} != {"delivered"}:
                    assert time.monotonic() - started < 30  # the lease (65 s) is not waited for
                    await asyncio.sleep(0.1)
    finally:
        await receiver.stop()
    assert [r.status for r in receiver.received] == [204, 204]  # the one held, then again
