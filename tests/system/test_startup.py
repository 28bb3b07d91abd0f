"""Start-up refuses a database it cannot use, in one line that names it, and
makes nothing on the way: no database where none was bootstrapped, no pepper
beside a database that already has one."""

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.components import require_command
from tests.server import Server, bootstrap, free_port, keysvc

NOT_BOOTSTRAPPED = (
    "keysvc: no database at {db}: make one with `keysvc bootstrap --db {db}`, or correct the path"
)


def serve(db: Path, *extra: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``keysvc serve`` expected to refuse; one that starts instead fails on the timeout."""
    command = [*prefix, sys.executable, "-m", "keysvc", "serve", "--db", str(db)]
    return subprocess.run(
        [*command, "--port", str(free_port()), *extra],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def shared_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder of the test's own, whose mode the test may take away."""
    folder = tmp_path / "db"
    folder.mkdir()
    try:
        yield folder
    finally:
        folder.chmod(0o755)  # so that it can be removed


def unprivileged() -> tuple[str, ...]:
    """A command prefix under which file modes apply. Root passes them all through
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so as root the command runs as root
    without those two (setpriv, from util-linux): the modes of its files then hold for
    it, and it still reads the checkout it runs from, which another user may not (a
    clone in a 0700 folder, such as /root or one from mktemp -d)."""
    if os.geteuid() != 0:
        return ()
    setpriv = require_command("setpriv", package="util-linux")
    return (setpriv, "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search")


def test_read_only_database_file_is_refused_in_one_line(shared_dir: Path) -> None:
    db = shared_dir / "keysvc.db"
    bootstrap(db)
    prefix = unprivileged()
    db.chmod(0o444)
    done = serve(db, prefix=prefix)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"keysvc: cannot use the database {db}: the file is read-only to this user"
        " (see its mode, its owner and its mount)"
    ]


def test_read_only_folder_is_refused_in_one_line(shared_dir: Path) -> None:
    db = shared_dir / "keysvc.db"
    bootstrap(db)
    prefix = unprivileged()
    shared_dir.chmod(0o555)
    for done in (serve(db, prefix=prefix), serve(db, "--workers", "2", prefix=prefix)):
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"keysvc: cannot use the database {db}: its folder {shared_dir} is read-only to"
            " this user, and SQLite writes keysvc.db-wal and keysvc.db-shm beside it"
        ]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_a_database_bootstrap_has_not_made(tmp_path: Path, workers: str) -> None:
    db = tmp_path / "typo" / "keysvc.db"
    done = serve(db, "--workers", workers)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [NOT_BOOTSTRAPPED.format(db=db)]
    assert not db.parent.exists()  # neither the file nor its folder was made


def test_serve_refuses_an_empty_file_and_leaves_it_empty(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    db.touch()
    done = serve(db)
    assert (done.returncode, done.stderr.splitlines()) == (2, [NOT_BOOTSTRAPPED.format(db=db)])
    assert db.stat().st_size == 0


def test_serve_refuses_another_programs_database_and_leaves_it_alone(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    conn = sqlite3.connect(db)
    conn.execute("create table notes (body text)")
    conn.commit()
    conn.close()
    done = serve(db)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"keysvc: database {db}: the database has no keysvc schema: make one with"
        " `keysvc bootstrap`, or correct the path"
    ]
    conn = sqlite3.connect(db)
    tables = conn.execute("select name from sqlite_master").fetchall()
    conn.close()
    assert tables == [("notes",)]


def test_restored_database_without_its_pepper_is_refused_and_no_pepper_written(
    tmp_path: Path,
) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    pepper = Path(f"{db}.pepper")
    pepper.unlink()
    refusal = (
        f"keysvc: pepper file {pepper} is missing, and no key in the database verifies"
        " without it: restore it from the backup beside the database, or set KEYSVC_PEPPER"
    )
    for done in (serve(db), keysvc("bootstrap", "--if-empty", "--db", str(db))):
        assert done.returncode == 2
        assert done.stderr.splitlines() == [refusal]
        assert not pepper.exists()


def test_start_up_line_names_the_database(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    with Server(db) as server:
        server.stop()
        lines = [json.loads(line) for line in server.stderr_text().splitlines()]
    (started,) = [line for line in lines if line["message"].startswith("Running on")]
    assert f"with database {db.absolute()}" in started["message"]
