"""A revoke-by-secret report acknowledged by a real `keysvc serve` killed with SIGKILL
right after its answer, before its work: the key is disabled at the next start.

The work is held off by hand, as an operator's shell could: a trigger that refuses
every change of a key's state, so that the background task's attempts fail and roll
back until the trigger goes. The report's row is then the only trace of it. On
PostgreSQL, the instance is killed inside the work's own transaction."""

import asyncio
import sqlite3
import time
from pathlib import Path

import asyncpg

from tests import pginstances
from tests.pginstances import ENV
from tests.postgres import Postgres
from tests.server import Server, bootstrap, call

admin = pginstances.admin

HOLD = """
    create trigger test_hold_leak_work before update of state on api_keys
    begin select raise(abort, 'held by the test'); end
"""
RELEASE = "drop trigger test_hold_leak_work"
# The instance's transaction, waiting for the key's row lock the test holds.
WAITING_ON_A_LOCK = """
    select exists (select 1 from pg_stat_activity
                   where wait_event_type = 'Lock' and pid <> pg_backend_pid())
"""
LEAKED_RECORDS = "select count(*) from activities where type = 'key_leaked'"


def _hand(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        with conn:
            return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_a_report_answered_before_a_kill_disables_its_key_at_the_next_start(
    tmp_path: Path,
) -> None:
    db = tmp_path / "keysvc.db"
    created = bootstrap(db)
    org = f"/v1/organizations/{created['organizationId']}/keys"
    with Server(db) as server:
        status, made = call(
            server.base, org, created, "POST", {"name": "ci", "roles": ["developer"]}
        )
        assert status == 200, made
        key_path = f"{org}/{made['result']['key']['id']}"
        _hand(db, HOLD)
        leaked = {"secret": made["result"]["keySecret"]}
        status, answer = call(server.base, "/v1/keys/revoke-leaked", created, "POST", leaked)
        assert (status, answer["result"]) == (200, {"status": "received"})
        server.proc.kill()  # SIGKILL, right after the answer
        server.proc.wait()
    assert _hand(db, "select count(*) from pending_leak_reports") == [(1,)]
    assert _hand(db, "select state from api_keys where name = 'ci'") == [("enabled",)]
    _hand(db, RELEASE)
    with Server(db) as server:
        started = time.monotonic()
        while call(server.base, key_path, created)[1]["result"]["state"] != "disabled":
            assert time.monotonic() - started < 5, "the key is still enabled"
            time.sleep(0.05)
    assert _hand(db, "select count(*) from pending_leak_reports") == [(0,)]
    assert _hand(db, LEAKED_RECORDS) == [(1,)]


async def test_a_kill_in_the_middle_of_the_work_on_postgresql_loses_nothing(
    postgres: Postgres, pg_database: str, admin: dict[str, str]
) -> None:
    """On PostgreSQL the work is held off inside its own transaction: the test holds the
    key's row lock, the instance's update waits for it, and the instance is killed
    there. Its transaction never commits; the next instance does the work."""
    url = postgres.url(pg_database)
    org = f"/v1/organizations/{admin['organizationId']}/keys"
    holder = await asyncpg.connect(url)
    try:
        with Server(url, env=ENV) as server:  # type: ignore[arg-type]
            body = {"name": "ci", "roles": ["developer"]}
            status, made = call(server.base, org, admin, "POST", body)
            assert status == 200, made
            key_id = made["result"]["key"]["id"]
            held = holder.transaction()
            await held.start()
            await holder.execute("select 1 from api_keys where id = $1 for update", key_id)
            leaked = {"secret": made["result"]["keySecret"]}
            status, answer = call(server.base, "/v1/keys/revoke-leaked", admin, "POST", leaked)
            assert (status, answer["result"]) == (200, {"status": "received"})
            started = time.monotonic()
            while not await holder.fetchval(WAITING_ON_A_LOCK):
                assert time.monotonic() - started < 10, "the work never reached the key"
                await asyncio.sleep(0.02)
            server.proc.kill()  # SIGKILL, in the middle of the work
            server.proc.wait()
            await held.rollback()
        assert await holder.fetchval("select count(*) from pending_leak_reports") == 1
        with Server(url, env=ENV) as server:  # type: ignore[arg-type]
            started = time.monotonic()
            while call(server.base, f"{org}/{key_id}", admin)[1]["result"]["state"] != "disabled":
                assert time.monotonic() - started < 10, "the key is still enabled"
                time.sleep(0.05)
        assert await holder.fetchval("select count(*) from pending_leak_reports") == 0
        assert await holder.fetchval(LEAKED_RECORDS) == 1
    finally:
        await holder.close()
