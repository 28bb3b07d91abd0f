"""SQLite's write-ahead log (``keysvc.db-wal``) removed from under a serving keysvc
(keysvc.db.sqlite.filewatch): the writes acknowledged before the removal sit in the
unlinked log, which keysvc copies into the database file (a checkpoint) as soon as it
notices; later writes are refused with 503 and Retry-After, /readyz says not ready,
and after a kill -9 and a restart every acknowledged write is there. The ``-shm`` file
removed is harmless: SQLite goes on with the memory it mapped."""

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.dbgone import _answer, _post_status, _refused
from tests.server import Server, bootstrap, call, integrity


def _create(server: Server, keys: str, admin: dict[str, str], name: str) -> int:
    status, retry_after, body = _post_status(
        server.base, keys, admin, {"name": name, "roles": ["developer"]}
    )
    if status != 200:
        _refused(status, retry_after, body)
    return int(status)


def _bootstrapped(tmp_path: Path) -> tuple[Path, dict[str, Any], dict[str, str], str]:
    """A new database in a folder of its own: its path, bootstrap's answer, the admin's
    credentials and the keys' path."""
    db = tmp_path / "var" / "keysvc.db"
    created = bootstrap(db)
    admin = {"keyId": created["keyId"], "keySecret": created["keySecret"]}
    return db, created, admin, f"/v1/organizations/{created['organizationId']}/keys"


def _names_after_restart(db: Path, keys: str, admin: dict[str, str]) -> list[str]:
    assert integrity(db) == ["ok"]
    with Server(db) as server:
        status, listed = call(server.base, keys + "?limit=100", admin)
        assert status == 200
        return sorted(key["name"] for key in listed["result"])


@pytest.mark.parametrize("noticed_by", ["create", "rename", "readyz"])
def test_a_removed_wal_refuses_writes_and_keeps_every_acknowledged_one(
    tmp_path: Path, noticed_by: str
) -> None:
    db, created, admin, keys = _bootstrapped(tmp_path)
    acknowledged = ["default admin", "before0", "before1", "before2"]
    with Server(db) as server:
        for name in acknowledged[1:]:
            assert _create(server, keys, admin, name) == 200
        wal = db.with_name("keysvc.db-wal")
        assert wal.exists()
        wal.unlink()
        if noticed_by == "readyz":
            status, _, body = _answer(server.base + "/readyz")
            assert (status, body["error"]) == (503, "not ready: the database does not answer")
        elif noticed_by == "rename":
            status, body = call(
                server.base, f"{keys}/{created['id']}", admin, "PATCH", {"name": "renamed"}
            )
            assert (status, body["status"]) == (503, 503), body
        else:
            for i in range(5):
                status = _create(server, keys, admin, f"after{i}")
                assert status == 503
        assert _answer(server.base + "/readyz")[0] == 503
        # The log lines reach stderr through the log's queue: a moment after the answers.
        deadline = time.monotonic() + 10
        while "pages were checkpointed into the database file" not in server.stderr_text():
            assert time.monotonic() < deadline, server.stderr_text()[-2000:]
            time.sleep(0.1)
        assert "keysvc.db-wal is no longer the file keysvc opened" in server.stderr_text()
        server.stop(signal.SIGKILL)
    assert _names_after_restart(db, keys, admin) == sorted(acknowledged)


def test_a_removed_shm_loses_no_acknowledged_write(tmp_path: Path) -> None:
    db, _, admin, keys = _bootstrapped(tmp_path)
    acknowledged = ["default admin", "before0", "before1", "before2"]
    with Server(db) as server:
        for name in acknowledged[1:]:
            assert _create(server, keys, admin, name) == 200
        db.with_name("keysvc.db-shm").unlink()
        for i in range(10):
            assert _create(server, keys, admin, f"after{i}") == 200
            acknowledged.append(f"after{i}")
        assert _answer(server.base + "/readyz")[0] == 200
        server.stop(signal.SIGKILL)
    assert _names_after_restart(db, keys, admin) == sorted(acknowledged)
