"""A revoke-by-secret report acknowledged by a real `keysvc serve` killed with SIGKILL
right after its answer, before its work: the key is disabled at the next start.

The work is held off by hand, as an operator's shell could: a trigger that refuses
every change of a key's state, so that the background task's attempts fail and roll
back until the trigger goes. The report's row is then the only trace of it."""

import sqlite3
import time
from pathlib import Path

from tests.server import Server, bootstrap, call

HOLD = """
    create trigger test_hold_leak_work before update of state on api_keys
    begin select raise(abort, 'held by the test'); end
"""
RELEASE = "drop trigger test_hold_leak_work"


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
    leaked_records = "select count(*) from activities where type = 'key_leaked'"
    assert _hand(db, leaked_records) == [(1,)]
