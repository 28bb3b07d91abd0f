"""CommitWatch: data_version from the WAL-index header, the pragma only when it moved.

These check the assumption the cache's freshness rests on against the SQLite this
Python links: every commit, by another connection or another process, changes the
header's bytes; and nothing else does.
"""

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from keysvc.db.sqlite.freshness import CommitWatch


class CountingConnection:
    """A sqlite3 connection that counts the statements run through it."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.statements: list[str] = []

    def execute(self, sql: str) -> sqlite3.Cursor:
        self.statements.append(sql)
        return self.conn.execute(sql)


def wal_database(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("pragma journal_mode = wal")
    conn.execute("create table t (x)")
    return conn


def watch(path: Path) -> tuple[CommitWatch, CountingConnection]:
    counting = CountingConnection(sqlite3.connect(path, isolation_level=None))
    return CommitWatch(counting, path), counting  # type: ignore[arg-type]


def test_no_commit_runs_no_statement(tmp_path: Path) -> None:
    wal_database(tmp_path / "db")
    watcher, counting = watch(tmp_path / "db")
    assert watcher.mapped
    first = watcher.version()
    counting.statements.clear()
    assert [watcher.version() for _ in range(100)] == [first] * 100
    assert counting.statements == []


def test_a_commit_on_another_connection_moves_the_version(tmp_path: Path) -> None:
    writer = wal_database(tmp_path / "db")
    watcher, counting = watch(tmp_path / "db")
    seen = {watcher.version()}
    counting.statements.clear()
    for n in range(20):
        writer.execute("insert into t values (?)", (n,))
        version = watcher.version()
        assert version not in seen
        seen.add(version)
        assert watcher.version() == version  # and stays put until the next commit
    assert counting.statements == ["pragma data_version"] * 20


def test_a_checkpoint_that_restarts_the_wal_is_seen(tmp_path: Path) -> None:
    """After a checkpoint the WAL starts again from frame 1: the salts change, so a
    commit there is seen even when it ends on the same frame number as before."""
    writer = wal_database(tmp_path / "db")
    watcher, _ = watch(tmp_path / "db")
    writer.execute("insert into t values (1)")
    before = watcher.version()
    writer.execute("pragma wal_checkpoint(truncate)")
    writer.execute("insert into t values (2)")
    assert watcher.version() != before


def test_a_commit_by_another_process_is_seen(tmp_path: Path) -> None:
    wal_database(tmp_path / "db").close()
    watcher, _ = watch(tmp_path / "db")
    before = watcher.version()
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
        " c.execute('insert into t values (1)')"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "db")], check=True)
    assert watcher.version() != before


def test_a_symlinked_database_maps_the_real_files_index(tmp_path: Path) -> None:
    writer = wal_database(tmp_path / "real.db")
    (tmp_path / "link.db").symlink_to(tmp_path / "real.db")
    watcher, _ = watch(tmp_path / "link.db")
    assert watcher.mapped
    before = watcher.version()
    writer.execute("insert into t values (1)")
    assert watcher.version() != before


@pytest.mark.parametrize("mode", ["delete", "no path"])
def test_without_a_wal_index_every_look_asks_the_pragma(tmp_path: Path, mode: str) -> None:
    writer = sqlite3.connect(tmp_path / "db", isolation_level=None)
    writer.execute("create table t (x)")  # a rollback-journal database: no -shm file
    counting = CountingConnection(sqlite3.connect(tmp_path / "db", isolation_level=None))
    path = tmp_path / "db" if mode == "delete" else None
    watcher = CommitWatch(counting, path)  # type: ignore[arg-type]
    assert not watcher.mapped
    before = watcher.version()
    counting.statements.clear()
    writer.execute("insert into t values (1)")
    assert watcher.version() != before
    assert watcher.version() != before
    assert counting.statements == ["pragma data_version"] * 2


WATCHING = """
import sqlite3, sys, threading
from pathlib import Path
from keysvc.db.sqlite.freshness import CommitWatch
path = Path(sys.argv[1])
held = sqlite3.connect(path, isolation_level=None)  # this process's own use of the database
held.execute("select count(*) from t").fetchone()
first = CommitWatch(sqlite3.connect(path, isolation_level=None), path)
second = CommitWatch(sqlite3.connect(path, isolation_level=None), path)
first.close()  # one of two watchers gone: the shared mapping stays, and so do the locks
print("ready", flush=True)
seen = set()
done = threading.Event()  # set once the other process has finished: it closes our stdin
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():  # looking all the while the other process comes and goes
    seen.add(second.version())
count = held.execute("select count(*) from t").fetchone()[0]
print(second.mapped, len(seen) > 1, count)
"""


def test_watching_never_costs_the_process_its_hold_on_the_index(tmp_path: Path) -> None:
    """Closing a descriptor of the -shm file drops every POSIX lock the process holds
    on it. Then the next process to open the database resets the WAL index under the
    watching process, which faults if it looks at that moment (a first version of
    walwatch did, and `keysvc backup` during a serve killed the server). Here one
    process looks, without pause, while others open, commit and close: it sees the
    commits and lives."""
    writer = wal_database(tmp_path / "db")
    writer.close()
    watching = subprocess.Popen(
        [sys.executable, "-c", WATCHING, str(tmp_path / "db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert watching.stdout is not None
    assert watching.stdout.readline() == "ready\n"
    for n in range(200):
        other = sqlite3.connect(tmp_path / "db", isolation_level=None)
        other.execute("insert into t values (?)", (n,))
        other.close()
    out, _ = watching.communicate(timeout=30)
    assert watching.returncode == 0
    assert out == "True True 200\n"
