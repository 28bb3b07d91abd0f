"""The database, its WAL and shared-memory files, and backups are readable by
their owner only (0600, as the pepper is), whatever the umask, through the
real ``keysvc bootstrap``, ``serve`` and ``backup`` commands."""

import json
import os
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from keysvc.config import pepper_path_of
from tests.helpers import Creds
from tests.server import Server, admin_creds


def mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keysvc", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(params=[0o022, 0o000], ids=["umask 022", "umask 000"])
def umask(request: pytest.FixtureRequest) -> Iterator[None]:
    """The umask of this process and of the commands it starts."""
    before = os.umask(request.param)
    try:
        yield
    finally:
        os.umask(before)


@pytest.mark.usefixtures("umask")
def test_database_wal_shm_and_backup_are_0600(tmp_path: Path) -> None:
    db = tmp_path / "data" / "keysvc.db"
    done = run("bootstrap", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert mode(db) == "0o600"
    assert mode(pepper_path_of(db)) == "0o600"
    admin = admin_creds(json.loads(done.stdout))

    with Server(db) as server:
        _create_key(server.base, admin)
        wal, shm = Path(f"{db}-wal"), Path(f"{db}-shm")
        assert wal.stat().st_size > 0  # the create went through the WAL
        assert {path.name: mode(path) for path in (db, wal, shm)} == {
            db.name: "0o600",
            wal.name: "0o600",
            shm.name: "0o600",
        }
        out = tmp_path / "backup.db"
        done = run("backup", "--db", str(db), str(out))
        assert done.returncode == 0, done.stderr
        assert mode(out) == "0o600"
        assert mode(pepper_path_of(out)) == "0o600"


def _create_key(base: str, admin: Creds) -> None:
    body = json.dumps({"name": "one", "roles": ["developer"]}).encode()
    request = urllib.request.Request(
        f"{base}/v1/organizations/{admin.organization_id}/keys",
        data=body,
        headers={**admin.headers, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_an_existing_database_keeps_its_mode(tmp_path: Path) -> None:
    """keysvc creates the file 0600; a file made by the operator is theirs to set."""
    db = tmp_path / "keysvc.db"
    db.touch(mode=0o640)
    db.chmod(0o640)
    done = run("bootstrap", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert mode(db) == "0o640"


def test_serve_warns_of_a_database_others_may_read(tmp_path: Path) -> None:
    """A database made 0644 by an older keysvc keeps its mode, and serve says so."""
    db = tmp_path / "keysvc.db"
    done = run("bootstrap", "--db", str(db))
    assert done.returncode == 0, done.stderr
    db.chmod(0o644)
    with Server(db) as server:
        server.stop()
        logged = server.stderr_text()
    warnings = [line for line in logged.splitlines() if "chmod 600" in line]
    assert len(warnings) == 1, logged
    assert str(db) in warnings[0] and "0o644" in warnings[0]
    assert mode(db) == "0o644"
