"""``keysvc import``'s planning process (``keysvc.cli.importworker``), on both backends:
a file longer than one batch is checked and planned there while the command writes.
If it stops, the command stops too and says so: the batches written stay written,
whole, none is half-written, and running the file again brings in the rest."""

import asyncio
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from keysvc.cli import porting
from keysvc.cli.importworker import Line
from keysvc.config import build_settings
from tests.postgres import PEPPER, Postgres
from tests.server import keysvc

ENV = {"KEYSVC_PEPPER": PEPPER.hex(), "KEYSVC_MAX_KEYS_PER_ORG": "50000"}
LINES = 12_000
BATCH = 100


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "keysvc.db")
    postgres: Postgres = request.getfixturevalue("postgres")
    return postgres.url(request.getfixturevalue("pg_database"))


def _file(tmp_path: Path, count: int) -> Path:
    source = tmp_path / "keys.jsonl"
    with source.open("w") as out:
        for n in range(count):
            digest = hashlib.sha256(f"token-{n}".encode()).hexdigest()
            record = {
                "importId": f"w-{n}",
                "name": f"worker {n}",
                "roles": ["developer"],
                "tokenHash": {"algorithm": "sha256", "encoding": "hex", "value": digest},
            }
            out.write(json.dumps(record) + "\n")
    return source


def _value(db: str, sql: str) -> Any:
    if db.startswith("postgres"):
        return asyncio.run(_pg_value(db, sql))
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchone()[0]


async def _pg_value(url: str, sql: str) -> Any:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval(sql)
    finally:
        await conn.close()


def _planning_child(pid: int) -> int | None:
    """The import's planning process: the child of ``pid`` that multiprocessing's
    spawn started (its resource tracker is another child)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for child in children:
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in command:
            return int(child)
    return None


def test_the_planning_process_killed_stops_the_import_with_whole_batches(
    db: str, tmp_path: Path
) -> None:
    done = keysvc("bootstrap", "--db", db, env=ENV)
    assert done.returncode == 0, done.stderr
    org = json.loads(done.stdout)["organizationId"]
    source = _file(tmp_path, LINES)
    command = [sys.executable, "-m", "keysvc", "import", "--db", db, "--org", org]
    running = subprocess.Popen(
        [*command, "--batch", str(BATCH), str(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENV},
    )
    try:
        deadline = time.monotonic() + 60
        batches = "select count(*) from activities where type = 'key_import'"
        while _value(db, batches) < 2:  # it is under way: the worker is planning ahead
            assert running.poll() is None, running.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        child = _planning_child(running.pid)
        assert child is not None
        os.kill(child, signal.SIGKILL)
        out, err = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 2, (out, err)
    assert "import: the planning process ended with exit code -9" in err
    keys = _value(db, "select count(*) from api_keys")
    written = _value(db, batches)
    assert 2 <= written < LINES // BATCH
    assert keys == 1 + written * BATCH  # the bootstrap's admin key, then whole batches
    again = subprocess.run(
        [*command, str(source)],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        check=False,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert (summary["imported"], summary["skipped"]) == (LINES - written * BATCH, written * BATCH)
    assert _value(db, "select count(*) from api_keys") == 1 + LINES


def test_a_planning_process_that_fails_says_why_and_nothing_is_written(tmp_path: Path) -> None:
    # The worker opens the store itself; here it cannot (no such file), as a database
    # gone between the command's start and the worker's would be.
    settings = build_settings({"db_path": str(tmp_path / "missing.db")}, env=ENV)
    written: list[object] = []

    async def write(*batch: object) -> None:
        written.append(batch)

    lines: list[Line] = [(1, b'{"importId": "a", "name": "a"}\n')]
    with pytest.raises(porting.ImportStopped, match="the planning process stopped: "):
        stopped = threading.Event()
        planned = porting._planned_apart(settings, "org", iter([lines, lines]), write, stopped)
        asyncio.run(planned)
    assert written == []


def test_an_import_that_stops_ends_though_its_standard_input_goes_on(tmp_path: Path) -> None:
    # The planning process is killed while the command's thread that reads standard
    # input waits for the rest of a batch that the program feeding it has not sent (nor
    # closed the input). The command ends then, with the reason: that thread is not
    # waited for.
    db = str(tmp_path / "keysvc.db")
    done = keysvc("bootstrap", "--db", db, env=ENV)
    assert done.returncode == 0, done.stderr
    org = json.loads(done.stdout)["organizationId"]
    lines = _file(tmp_path, 3 * BATCH).read_bytes().splitlines(keepends=True)
    command = [sys.executable, "-m", "keysvc", "import", "--db", db, "--org", org]
    with subprocess.Popen(
        [*command, "--batch", str(BATCH), "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **ENV},
    ) as running:
        assert running.stdin is not None and running.stderr is not None
        try:
            # Two whole batches (the command plans apart from a second one on), then half
            # of a third, and the input left open.
            running.stdin.write(b"".join(lines[: 2 * BATCH + BATCH // 2]))
            running.stdin.flush()
            deadline = time.monotonic() + 60
            batches = "select count(*) from activities where type = 'key_import'"
            while _value(db, batches) < 2:
                assert running.poll() is None
                assert time.monotonic() < deadline
                time.sleep(0.02)
            child = _planning_child(running.pid)
            assert child is not None
            os.kill(child, signal.SIGKILL)
            started = time.monotonic()
            try:
                running.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail("the import went on waiting for its input")
            waited = time.monotonic() - started
        finally:
            running.kill()
            running.stdin.close()
        err = running.stderr.read().decode()
    assert running.returncode == 2, err
    assert "import: the planning process ended with exit code -9" in err
    assert waited < 10
    assert _value(db, "select count(*) from api_keys") == 1 + 2 * BATCH
