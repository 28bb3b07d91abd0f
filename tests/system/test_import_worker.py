"""``keysvc import``'s planning process (``keysvc.cli.importworker``), on both backends:
a file longer than one batch is checked and planned there while the command writes.
If it stops, the command stops too and says so: the batches written stay written,
whole, none is half-written, and running the file again brings in the rest."""

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from keysvc.cli import porting
from keysvc.cli.importworker import Line
from keysvc.config import build_settings
from tests.handsql import hand_value
from tests.postgres import PEPPER
from tests.server import bootstrap, keysvc

ENV = {"KEYSVC_PEPPER": PEPPER.hex(), "KEYSVC_MAX_KEYS_PER_ORG": "50000"}
LINES = 12_000
BATCH = 100


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
    """The one value ``sql`` answers on ``db`` (a file's path or a PostgreSQL URL)."""
    return hand_value(build_settings({"db_path": db}, env=ENV), sql)


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


BATCHES = "select count(*) from activities where type = 'key_import'"


def _under_way(db: str, running: "subprocess.Popen[Any]") -> int:
    """The planning process of ``running``, once two batches are written: the import
    is under way, its planning process planning ahead."""
    deadline = time.monotonic() + 60
    while _value(db, BATCHES) < 2:
        assert running.poll() is None
        assert time.monotonic() < deadline
        time.sleep(0.02)
    child = _planning_child(running.pid)
    assert child is not None
    return child


def test_the_planning_process_killed_stops_the_import_with_whole_batches(
    db: str, tmp_path: Path
) -> None:
    org = bootstrap(db, env=ENV)["organizationId"]
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
        child = _under_way(db, running)
        os.kill(child, signal.SIGKILL)
        out, err = running.communicate(timeout=60)
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 2, (out, err)
    assert "import: the planning process ended with exit code -9" in err
    keys = _value(db, "select count(*) from api_keys")
    written = _value(db, BATCHES)
    assert 2 <= written < LINES // BATCH
    assert keys == 1 + written * BATCH  # the bootstrap's admin key, then whole batches
    again = keysvc("import", "--db", db, "--org", org, str(source), env=ENV, timeout=120)
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
    org = bootstrap(db, env=ENV)["organizationId"]
    lines = _file(tmp_path, 3 * BATCH).read_bytes().splitlines(keepends=True)
    with _importing_from_stdin(db, org) as running:
        assert running.stdin is not None and running.stderr is not None
        try:
            # Two whole batches (the command plans apart from a second one on), then half
            # of a third, and the input left open.
            running.stdin.write(b"".join(lines[: 2 * BATCH + BATCH // 2]))
            running.stdin.flush()
            child = _under_way(db, running)
            os.kill(child, signal.SIGKILL)
            started = time.monotonic()
            _ends_within(running, 30, "the import went on waiting for its input")
            waited = time.monotonic() - started
        finally:
            running.kill()
            running.stdin.close()
        err = running.stderr.read().decode()
    assert running.returncode == 2, err
    assert "import: the planning process ended with exit code -9" in err
    assert waited < 10
    assert _value(db, "select count(*) from api_keys") == 1 + 2 * BATCH


def _importing_from_stdin(db: str, org: str) -> "subprocess.Popen[bytes]":
    """``keysvc import ... -`` in BATCH-line batches, its standard input a pipe to feed."""
    command = [sys.executable, "-m", "keysvc", "import", "--db", db, "--org", org]
    return subprocess.Popen(
        [*command, "--batch", str(BATCH), "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **ENV},
    )


def _ends_within(running: "subprocess.Popen[Any]", seconds: float, failure: str) -> None:
    try:
        running.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(failure)


def _rss_of_import(command: list[str]) -> tuple[subprocess.CompletedProcess[str], int]:
    """``command`` run by a fresh interpreter, and the largest resident size in KiB
    that it or the processes it waited for reached (the import, its planning one)."""
    script = (
        "import json, resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps([done.returncode, done.stdout, done.stderr, peak]))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script, *command],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        check=False,
        timeout=120,
    )
    code, out, err, peak = json.loads(ran.stdout)
    return subprocess.CompletedProcess(command, code, out, err), int(peak)


def test_lines_of_a_mebibyte_cost_no_batch_of_them_in_memory(tmp_path: Path) -> None:
    # rt60 F2: lines are kept as read until they are checked, so a batch is cut at
    # BATCH_BYTES as well as at its count. 300 lines of 1 MiB, each refused (not JSON),
    # with the largest batch: before, all 300 were held (200 such lines peaked at 241
    # MB, 400 at 440; with the cut, 148 and 166).
    db = str(tmp_path / "keysvc.db")
    org = bootstrap(db, env=ENV)["organizationId"]
    source = tmp_path / "junk.jsonl"
    line = b"x" * (1024 * 1024 - 1) + b"\n"
    with source.open("wb") as out:
        for _ in range(300):
            out.write(line)
    command = [sys.executable, "-m", "keysvc", "import", "--db", db, "--org", org]
    ran, peak = _rss_of_import([*command, "--batch", "20000", str(source)])
    assert ran.returncode == 1, ran.stderr
    assert json.loads(ran.stdout)["refused"] == 300
    assert ran.stderr.count("not JSON") == 300
    assert peak < 250 * 1024, f"{peak} KiB"


def test_a_stopped_planning_process_does_not_hold_ctrl_c(tmp_path: Path) -> None:
    # rt60 F4: the planning process stopped (SIGSTOP) leaves the import waiting; Ctrl-C
    # must still end it, and the planning process with it.
    db = str(tmp_path / "keysvc.db")
    org = bootstrap(db, env=ENV)["organizationId"]
    source = _file(tmp_path, LINES)
    command = [sys.executable, "-m", "keysvc", "import", "--db", db, "--org", org]
    with subprocess.Popen(
        [*command, "--batch", str(BATCH), str(source)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **ENV},
    ) as running:
        child = None
        try:
            child = _under_way(db, running)
            os.kill(child, signal.SIGSTOP)
            time.sleep(0.5)
            running.send_signal(signal.SIGINT)
            _ends_within(
                running, 20, "Ctrl-C did not end an import whose planning process was stopped"
            )
        finally:
            running.kill()
            if child is not None and Path(f"/proc/{child}").exists():
                os.kill(child, signal.SIGKILL)
    assert running.returncode != 0
    time.sleep(0.5)
    state = Path(f"/proc/{child}/stat")
    assert not state.exists() or state.read_text().split()[2] == "Z"


def test_a_line_the_api_would_refuse_is_refused_by_its_number(db: str, tmp_path: Path) -> None:
    # rt60 F5, F6: each line is decoded as the API decodes a body. A lone surrogate
    # escape ended the whole import (it cannot be stored), a nesting deep enough ended
    # it with a RecursionError, and an importId of printable ASCII then a NUL and a
    # newline went in. Each is now its line's refusal, in batches planned apart (2
    # lines) and in one batch planned here.
    org = bootstrap(db, env=ENV)["organizationId"]
    good = [json.dumps({"importId": f"g-{n}", "name": f"good {n}", "roles": ["developer"]})
            for n in range(4)]  # fmt: skip
    bad = [
        '{"importId": "s-1", "name": "\\ud800x", "roles": ["developer"]}',
        "[" * 200_000,
        '{"importId": "d-1", "name": "a", "name": "b", "roles": ["developer"]}',
        json.dumps({"importId": "ok\u0000 \n\u2028 x", "name": "n", "roles": ["developer"]}),
        '{"importId": "n-1", "name": "nan", "roles": ["developer"], "meta": {"x": NaN}}',
    ]
    lines = [good[0], bad[0], good[1], bad[1], bad[2], good[2], bad[3], bad[4], good[3]]
    source = tmp_path / "keys.jsonl"
    source.write_text("\n".join(lines) + "\n")
    # Planned apart (batches of 2), then in one batch planned here: the second run
    # skips what the first imported, and refuses the same lines alike.
    for batch, imported, skipped in (("2", 4, 0), ("100", 0, 4)):
        ran = keysvc(
            "import", "--db", db, "--org", org, "--batch", batch, str(source),
            env=ENV, timeout=120,
        )  # fmt: skip
        assert ran.returncode == 1, ran.stderr
        assert "Traceback" not in ran.stderr
        reasons = dict(
            line.removeprefix("keysvc: import: line ").split(": ", 1)
            for line in ran.stderr.splitlines()
        )
        assert set(reasons) == {"2", "4", "5", "7", "8"}, ran.stderr
        assert "lone surrogate" in reasons["2"]
        assert reasons["4"] == "not JSON: JSON is nested too deeply"
        assert "appears more than once" in reasons["5"]
        assert reasons["7"].startswith("importId: must be printable ASCII")
        assert "NaN" in reasons["8"]
        summary = json.loads(ran.stdout)
        assert (summary["imported"], summary["skipped"], summary["refused"]) == (
            imported,
            skipped,
            5,
        )


def test_ctrl_c_ends_an_import_still_reading_its_first_batches(tmp_path: Path) -> None:
    # rt61 F1: the first two batches were read on the loop's thread, which Ctrl-C (a
    # cancel of the loop's task) does not reach while it waits for input: with standard
    # input left open, one Ctrl-C did nothing, a second left the command hanging.
    db = str(tmp_path / "keysvc.db")
    org = bootstrap(db, env=ENV)["organizationId"]
    half = _file(tmp_path, BATCH // 2).read_bytes()
    with _importing_from_stdin(db, org) as running:
        assert running.stdin is not None
        try:
            running.stdin.write(half)  # half a batch, and the input left open
            running.stdin.flush()
            time.sleep(3)  # started, and waiting for the rest
            assert running.poll() is None
            running.send_signal(signal.SIGINT)
            _ends_within(running, 10, "one Ctrl-C did not end an import waiting for its input")
        finally:
            running.kill()
            running.stdin.close()
    assert running.returncode != 0
    assert _value(db, "select count(*) from api_keys") == 1


def test_an_import_from_a_closed_standard_input_says_so(tmp_path: Path) -> None:
    # rt61 F4: with no standard input at all, `-` ended in an AttributeError's traceback
    # and exit code 1, the code of refused lines.
    db = str(tmp_path / "keysvc.db")
    org = bootstrap(db, env=ENV)["organizationId"]
    ran = subprocess.run(
        [sys.executable, "-m", "keysvc", "import", "--db", db, "--org", org, "-"],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV},
        preexec_fn=lambda: os.close(0),  # the child's own standard input, before exec
        check=False,
        timeout=60,
    )
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr
    assert "standard input" in ran.stderr
