"""SQLite's ``-shm`` file (the WAL index) removed from under a serving keysvc, then
another process opens the database: the operator's ``keysvc revoke-leaked``, or a
second ``keysvc serve``. The serving process keeps the index it mapped; a process that
opened the file now would make a new one, and the two would append to one log
without seeing each other's commits: the CLI's revocation acknowledged, never seen by
the server, and written over at its next commit. A reader that is not keysvc, run in
between, leaves a new ``-shm`` at the path that the server does not use: no better.
``keysvc backup`` refuses as well. So the newcomer refuses, saying why,
and once the serving process is restarted the revocation goes through."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server import Server, bootstrap, call

REFUSAL = "its -shm file (the WAL index) or its -wal is gone while another process serves it"
BODY = {"name": "leaked", "roles": ["developer"]}


def _revoke_leaked(db: Path, secret: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keysvc", "revoke-leaked", "--db", str(db)],
        input=secret + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("between", ["nothing", "a reader"])
def test_a_revocation_by_another_process_is_refused_not_lost_while_the_index_is_gone(
    tmp_path: Path, between: str
) -> None:
    db = tmp_path / "var" / "keysvc.db"
    created = bootstrap(db)
    admin = {"keyId": created["keyId"], "keySecret": created["keySecret"]}
    keys = f"/v1/organizations/{created['organizationId']}/keys"
    with Server(db) as server:
        status, body = call(server.base, keys, admin, "POST", BODY)
        assert status == 200, body
        leaked = {"keyId": body["result"]["keyId"], "keySecret": body["result"]["keySecret"]}
        db.with_name("keysvc.db-shm").unlink()
        if between == "a reader":
            # A reader that is not keysvc (the sqlite3 shell, say) makes a new -shm at
            # the path, which the serving process does not use.
            read = f"import sqlite3; c = sqlite3.connect({str(db)!r}); c.execute('select 1')"
            subprocess.run([sys.executable, "-c", read + "; c.close()"], check=True, timeout=60)
        backup = subprocess.run(
            [sys.executable, "-m", "keysvc", "backup", "--db", str(db), str(tmp_path / "b")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert backup.returncode != 0 and REFUSAL in backup.stderr, backup.stderr
        done = _revoke_leaked(db, leaked["keySecret"])
        assert done.returncode != 0, done.stdout
        assert REFUSAL in done.stderr, done.stderr
        assert '"matched": true' not in done.stdout
        second = subprocess.run(
            [sys.executable, "-m", "keysvc", "serve", "--db", str(db), "--port", "0"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert second.returncode != 0 and REFUSAL in second.stderr, second.stderr[-2000:]
        # The serving process goes on, on the index it mapped, and loses nothing; if
        # the reader took its log away, its writes wait for a restart (test_wal_gone).
        log_taken = not db.with_name("keysvc.db-wal").exists()
        assert not (log_taken and between == "nothing")
        status, body = call(server.base, keys, admin, "POST", {**BODY, "name": "after"})
        assert status == (503 if log_taken else 200), body
        # Not revoked in the server's eyes (its usedAt touch, a write, waits as well).
        assert call(server.base, "/v1/whoami", leaked)[0] == (503 if log_taken else 200)
        server.stop(signal.SIGTERM)
    done = _revoke_leaked(db, leaked["keySecret"])
    assert (done.returncode, done.stdout.strip()) == (0, '{"matched": true}'), done.stderr
    with Server(db) as server:
        assert call(server.base, "/v1/whoami", leaked)[0] == 401
        status, listed = call(server.base, keys + "?limit=100", admin)
        states = {key["name"]: key["state"] for key in listed["result"]}
    expected = {"default admin": "enabled", "leaked": "disabled"}
    if not log_taken:
        expected["after"] = "enabled"
    assert states == expected
