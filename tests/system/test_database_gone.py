"""SQLite's file gone from under a serving keysvc (keysvc.db.sqlite.filewatch): its
folder removed, or moved away and back. Writes are refused with 503 and Retry-After
rather than acknowledged into a file no one will open again, /readyz says not ready,
and nothing, /metrics included, makes an empty database where the file was."""

import json
import shutil
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tests.helpers import basic
from tests.server import Server, bootstrap, call, integrity

GONE = "database unavailable: its file is no longer where it was opened; nothing was written"


def _answer(url: str, creds: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """A GET's status, headers and JSON body (None when it is not JSON)."""
    headers = {} if creds is None else basic(creds["keyId"], creds["keySecret"])
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, got, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as refused:
        status, got, raw = refused.code, dict(refused.headers), refused.read()
    try:
        return status, got, json.loads(raw)
    except ValueError:
        return status, got, None


def _metric(base: str, name: str) -> float:
    """The value of the unlabelled metric ``name`` in a scrape of /metrics (200)."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
        text = response.read().decode()
    [value] = [line.split()[1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


def _post_status(base: str, path: str, creds: dict[str, str], body: dict[str, Any]) -> Any:
    """A POST with ``creds``: its status, Retry-After and body."""
    data = json.dumps(body).encode()
    headers = {**basic(creds["keyId"], creds["keySecret"]), "Content-Type": "application/json"}
    request = urllib.request.Request(base + path, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Retry-After"), json.loads(response.read())
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers.get("Retry-After"), json.loads(refused.read())


def _refused(status: int, retry_after: str | None, body: dict[str, Any]) -> None:
    assert (status, retry_after, body["status"], body["error"]) == (503, "5", 503, GONE), body
    assert uuid.UUID(body["requestId"]).version == 4


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
        assert "is no longer the file keysvc opened" in server.stderr_text()
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
