"""keysvc backup: a consistent copy of a serving database, restored and used.

The main test backs up a real server while threads keep creating keys over
HTTP, then serves the copy and proves that every create acknowledged before
the backup began is there and still authenticates.
"""

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from keysvc.ops.backup import BackupDamaged, make_backup
from tests.helpers import Creds, basic
from tests.server import Server, admin_creds, bootstrap, free_port, integrity, keysvc

PEPPER = "p" * 40
WRITERS = 4
BEFORE_BACKUP = 60  # creates acknowledged before the backup starts, at least


@dataclass(frozen=True)
class Acked:
    at: float  # time.monotonic() once the 200 had been read
    creds: Creds
    name: str


class CreateStream:
    """Threads that create keys over HTTP until stopped, recording each 200 and when it came."""

    def __init__(self, base: str, admin: dict[str, Any]):
        self._url = f"{base}/v1/organizations/{admin['organizationId']}/keys"
        self._admin = admin
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(WRITERS)
        ]
        self.acked: list[Acked] = []
        self.errors: list[str] = []

    def __enter__(self) -> "CreateStream":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in self._threads)

    def wait_for(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count and not self.errors:
            assert time.monotonic() < deadline, f"only {len(self.acked)} creates in {timeout}s"
            time.sleep(0.01)
        assert not self.errors, self.errors

    def _run(self, writer: int) -> None:
        headers = {
            **basic(self._admin["keyId"], self._admin["keySecret"]),
            "Content-Type": "application/json",
        }
        number = 0
        while not self._stop.is_set():
            name = f"stream {writer}-{number}"
            body = json.dumps({"name": name, "roles": ["developer"]}).encode()
            request = urllib.request.Request(self._url, body, headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    status, result = response.status, json.load(response)["result"]
            except (OSError, ValueError) as exc:
                with self._lock:
                    self.errors.append(f"{name}: {exc!r}")
                return
            at = time.monotonic()
            if status != 200:
                with self._lock:
                    self.errors.append(f"{name}: status {status}")
                return
            creds = Creds(
                self._admin["organizationId"],
                result["key"]["id"],
                result["keyId"],
                result["keySecret"],
            )
            with self._lock:
                self.acked.append(Acked(at, creds, name))
            number += 1


@contextmanager
def serving(db: Path, env: dict[str, str] | None = None) -> Iterator[Server]:
    """A Server whose piped output is read as it comes: a full pipe stalls its request log."""
    with Server(db, env) as server:
        streams = [stream for stream in (server.proc.stdout, server.proc.stderr) if stream]
        readers = [threading.Thread(target=_drain, args=(s,), daemon=True) for s in streams]
        for reader in readers:
            reader.start()
        try:
            yield server
        finally:
            if server.proc.poll() is None:
                server.proc.kill()
            server.proc.wait()
            for reader in readers:
                reader.join(timeout=10)


def _drain(stream: IO[bytes]) -> None:
    try:
        while stream.read(65536):
            pass
    except (OSError, ValueError):
        pass  # closed under us


def get_key(base: str, caller: Creds, key_id: str) -> tuple[int, dict[str, Any]]:
    url = f"{base}/v1/organizations/{caller.organization_id}/keys/{key_id}"
    request = urllib.request.Request(url, headers=caller.headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


def restore(backup: Path, target: Path, *, pepper: bool = True) -> Path:
    """Copy a backup (and its pepper file) to a fresh place, as an operator would."""
    target.mkdir()
    db = target / "keysvc.db"
    shutil.copyfile(backup, db)
    if pepper:
        shutil.copyfile(f"{backup}.pepper", f"{db}.pepper")
    return db


def serve_refused(db: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``keysvc serve``, which is expected to refuse to start."""
    command = [sys.executable, "-m", "keysvc", "serve", "--db", str(db)]
    return subprocess.run(
        [*command, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_backup_while_serving_keeps_every_acknowledged_key(tmp_path: Path) -> None:
    db = tmp_path / "live" / "keysvc.db"
    db.parent.mkdir()
    created = bootstrap(db)
    admin = admin_creds(created)
    out = tmp_path / "backups" / "keysvc-backup.db"
    out.parent.mkdir()

    with (
        serving(db, env={"KEYSVC_MAX_KEYS_PER_ORG": "1000000"}) as server,
        CreateStream(server.base, created) as stream,
    ):
        stream.wait_for(BEFORE_BACKUP)
        started = time.monotonic()
        done = keysvc("backup", "--db", str(db), str(out))
        finished = time.monotonic()
        stream.wait_for(len(stream.acked) + WRITERS)  # the stream outlived the backup
    assert not stream.errors, stream.errors
    assert done.returncode == 0, done.stderr
    before = [acked for acked in stream.acked if acked.at < started]
    during = [acked for acked in stream.acked if started < acked.at < finished]
    assert len(before) >= BEFORE_BACKUP
    assert during, "no create was acknowledged while the backup ran"

    assert done.stdout.count("\n") == 1
    report = json.loads(done.stdout)
    assert report == {
        "path": str(out),
        "bytes": out.stat().st_size,
        "keys": report["keys"],
        "pepperPath": f"{out}.pepper",
    }
    # The bootstrap admin, every key acknowledged before, perhaps some made during.
    assert 1 + len(before) <= report["keys"] <= 1 + len(stream.acked)
    assert stat.S_IMODE(Path(f"{out}.pepper").stat().st_mode) == 0o600
    assert Path(f"{out}.pepper").read_bytes() == Path(f"{db}.pepper").read_bytes()
    assert sorted(os.listdir(out.parent)) == [out.name, f"{out.name}.pepper"]

    restored = restore(out, tmp_path / "restored")
    assert integrity(restored) == ["ok"]
    with serving(restored) as server:
        status, body = get_key(server.base, admin, admin.id)
        assert status == 200, body
        for acked in before:
            # The key's own credentials: it was restored and it still authenticates.
            status, body = get_key(server.base, acked.creds, acked.creds.id)
            assert status == 200, (acked, body)
            assert (body["result"]["id"], body["result"]["name"]) == (acked.creds.id, acked.name)
        assert server.stop() < 10
        assert server.proc.returncode == 0


@pytest.mark.parametrize("existing", ["", ".pepper"])
def test_backup_refuses_to_overwrite(tmp_path: Path, existing: str) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    out = tmp_path / "out" / "backup.db"
    out.parent.mkdir()
    taken = Path(f"{out}{existing}")
    taken.write_bytes(b"precious")

    done = keysvc("backup", "--db", str(db), str(out))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"keysvc: backup: {taken} already exists; a backup never overwrites a file"
    ]
    assert taken.read_bytes() == b"precious"
    assert os.listdir(out.parent) == [taken.name]  # nothing else made, no temporary left


def test_backup_of_a_missing_database_is_refused(tmp_path: Path) -> None:
    done = keysvc("backup", "--db", str(tmp_path / "none.db"), str(tmp_path / "out.db"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"keysvc: backup: no database at {tmp_path / 'none.db'}"]
    assert os.listdir(tmp_path) == []  # and no empty database was created


def test_restored_backup_refuses_a_different_pepper(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    admin = admin_creds(bootstrap(db))
    out = tmp_path / "backup.db"
    assert keysvc("backup", "--db", str(db), str(out)).returncode == 0

    restored = restore(out, tmp_path / "restored", pepper=False)
    Path(f"{restored}.pepper").write_bytes(b"f" * 64 + b"\n")  # someone else's pepper
    for env in (None, {"KEYSVC_PEPPER": PEPPER}):
        done = serve_refused(restored, env)
        assert done.returncode == 2, done.stderr
        assert "the pepper does not match this database" in done.stderr

    shutil.copyfile(f"{out}.pepper", f"{restored}.pepper")
    with Server(restored) as server:
        status, body = get_key(server.base, admin, admin.id)
        assert status == 200, body


def test_backup_with_pepper_from_the_environment(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    env = {"KEYSVC_PEPPER": PEPPER}
    assert keysvc("bootstrap", "--db", str(db), env=env).returncode == 0
    out = tmp_path / "backup.db"

    without = keysvc("backup", "--db", str(db), str(out))
    assert without.returncode == 2
    assert f"pepper file {db}.pepper not found" in without.stderr
    assert not out.exists()

    done = keysvc("backup", "--db", str(db), str(out), env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "keysvc: note: the pepper comes from KEYSVC_PEPPER and is not in the backup;"
        " keep it separately, no key in the backup verifies without it"
    ]
    assert json.loads(done.stdout)["pepperPath"] is None
    assert not Path(f"{out}.pepper").exists()

    restored = restore(out, tmp_path / "restored", pepper=False)
    again = keysvc("bootstrap", "--if-empty", "--db", str(restored), env=env)
    assert (again.returncode, again.stdout) == (0, ""), again.stderr  # opened, pepper accepted


def test_backup_is_a_snapshot_of_committed_writes_even_in_the_wal(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    writer = sqlite3.connect(db, isolation_level=None)
    try:
        # As in a serving keysvc: WAL, and a connection that stays open, so the
        # committed row stays in the WAL and is not in the main file.
        assert writer.execute("pragma journal_mode").fetchone() == ("wal",)
        writer.execute("pragma wal_autocheckpoint = 0")
        writer.execute("insert into meta (name, value) values ('committed', 'yes')")
        assert Path(f"{db}-wal").stat().st_size > 0
        writer.execute("begin immediate")  # a write in progress: holds the write lock
        writer.execute("insert into meta (name, value) values ('uncommitted', 'no')")
        done = keysvc("backup", "--db", str(db), str(tmp_path / "backup.db"))
        writer.execute("rollback")
    finally:
        writer.close()
    assert done.returncode == 0, done.stderr
    copy = sqlite3.connect(tmp_path / "backup.db")
    try:
        names = {row[0] for row in copy.execute("select name from meta")}
        mode = copy.execute("pragma journal_mode").fetchone()
    finally:
        copy.close()
    assert names - {"auth_generation"} == {"pepper", "committed"}
    assert mode == ("delete",)  # one self-contained file
    assert not Path(f"{tmp_path / 'backup.db'}-wal").exists()


def _damage_an_index(db: Path) -> None:
    """Overwrite entries of one index page, so the table and its index disagree."""
    conn = sqlite3.connect(db)
    try:
        page_size = conn.execute("pragma page_size").fetchone()[0]
        root = conn.execute(
            "select rootpage from sqlite_schema where name = 'api_keys_org_position'"
        ).fetchone()[0]
    finally:
        conn.close()
    with open(db, "r+b") as handle:
        handle.seek(page_size * root - 20)  # the cell content at the end of the page
        handle.write(b"\xff" * 8)
    assert integrity(db) != ["ok"]


def test_backup_of_a_damaged_database_fails_loudly(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    _damage_an_index(db)
    out = tmp_path / "out" / "backup.db"
    out.parent.mkdir()

    done = keysvc("backup", "--db", str(db), str(out))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(
        f"keysvc: backup: the copy of {db} failed PRAGMA integrity_check, so no backup was written"
    )
    assert "api_keys_org_position" in done.stderr
    assert os.listdir(out.parent) == []

    with pytest.raises(BackupDamaged):
        make_backup(db, out, None, Path(f"{db}.pepper"))
    assert os.listdir(out.parent) == []
