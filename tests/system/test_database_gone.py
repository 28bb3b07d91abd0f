"""SQLite's file gone from under a serving keysvc (keysvc.db.sqlite.filewatch): its
folder removed, or moved away and back. Writes are refused with 503 and Retry-After
rather than acknowledged into a file no one will open again, /readyz says not ready,
and nothing, /metrics included, makes an empty database where the file was."""

import shutil
import time
from pathlib import Path

from tests.dbgone import GONE, _answer, _metric, _post_status, _refused
from tests.server import Server, bootstrap, call, integrity


def test_a_removed_folder_refuses_writes_is_not_ready_and_is_not_made_again(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "data"
    db = folder / "keysvc.db"
    created = bootstrap(db)
    admin = {"keyId": created["keyId"], "keySecret": created["keySecret"]}
    keys = f"/v1/organizations/{created['organizationId']}/keys"
    with Server(db) as server:
        status, _ = call(
            server.base, keys, admin, "POST", {"name": "before", "roles": ["developer"]}
        )
        assert status == 200
        assert _answer(server.base + "/readyz")[0] == 200
        shutil.rmtree(folder)
        # The key counts' connection, opened at the first scrape, makes no new file, and
        # /metrics is served: the keys by state are the last count (none), not counted now.
        status, _, _ = _answer(server.base + "/metrics")
        assert status == 200
        assert _metric(server.base, "keysvc_keys_counted") == 0
        assert not folder.exists()

        _refused(*_post_status(server.base, keys, admin, {"name": "lost", "roles": ["developer"]}))
        # A write through the writer's own transactions too: the admin's rename.
        status, body = call(
            server.base, f"{keys}/{created['id']}", admin, "PATCH", {"name": "renamed"}
        )
        assert (status, body["error"]) == (503, GONE)
        status, _, body = _answer(server.base + "/readyz")
        assert (status, body["error"]) == (503, "not ready: the database does not answer")
        # Reads still answer from the file as it was opened.
        assert _answer(server.base + keys, admin)[0] == 200
        assert _metric(server.base, "keysvc_keys_counted") == 0
        assert not folder.exists()
        # The log line reaches stderr through the log's queue: a moment after the answers
        # (on a loaded machine, more than a moment).
        deadline = time.monotonic() + 10
        while "is no longer the file keysvc opened" not in (logged := server.stderr_text()):
            assert time.monotonic() < deadline, logged[-2000:]
            time.sleep(0.1)
    assert not folder.exists()


def test_a_folder_moved_away_and_back_refuses_writes_only_meanwhile(tmp_path: Path) -> None:
    folder, away = tmp_path / "data", tmp_path / "away"
    db = folder / "keysvc.db"
    created = bootstrap(db)
    admin = {"keyId": created["keyId"], "keySecret": created["keySecret"]}
    keys = f"/v1/organizations/{created['organizationId']}/keys"
    with Server(db) as server:
        assert call(server.base, keys, admin)[0] == 200  # the admin's proof is kept
        folder.rename(away)
        _refused(*_post_status(server.base, keys, admin, {"name": "lost", "roles": ["developer"]}))
        assert _answer(server.base + "/readyz")[0] == 503
        away.rename(folder)
        assert _answer(server.base + "/readyz")[0] == 200
        status, _, body = _post_status(
            server.base, keys, admin, {"name": "kept", "roles": ["developer"]}
        )
        assert status == 200, body
        # The log lines reach stderr through the log's queue: a moment after the answers.
        deadline = time.monotonic() + 10
        while not ("database file" in (logged := server.stderr_text()) and "is back" in logged):
            assert time.monotonic() < deadline, logged[-2000:]
            time.sleep(0.1)
    assert integrity(db) == ["ok"]
    with Server(db) as server:
        status, listed = call(server.base, keys, admin)
        assert status == 200
        assert sorted(key["name"] for key in listed["result"]) == ["default admin", "kept"]
