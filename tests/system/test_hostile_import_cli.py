"""The hostile review of issue 37's ``keysvc import`` and ``keysvc export`` (rt37), as
an operator runs them on both backends: a file with a line that is not UTF-8, or one
line far longer than any record, is imported but for that line, named by its number;
an export keeps what a key's record holds (its named rate limits)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.postgres import PEPPER
from tests.server import keysvc

ENV = {"KEYSVC_PEPPER": PEPPER.hex()}
BURST = {"name": "burst", "limit": 10, "windowSeconds": 1, "autoApply": True}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keysvc", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **ENV},
        check=False,
    )


def _line(n: int, **fields: Any) -> bytes:
    record = {"importId": f"r{n}", "name": f"r{n}", "roles": ["developer"], **fields}
    return json.dumps(record).encode() + b"\n"


def _organization(db: str) -> str:
    done = keysvc("bootstrap", "--db", db, env=ENV)
    assert done.returncode == 0, done.stderr
    organization: str = json.loads(done.stdout)["organizationId"]
    return organization


def test_a_line_that_is_not_utf8_or_too_long_is_refused_by_number_and_the_rest_go_in(
    db: str, tmp_path: Path
) -> None:
    org = _organization(db)
    path = tmp_path / "keys.jsonl"
    with path.open("wb") as out:
        out.writelines(_line(n) for n in range(1, 5))
        out.write(b'{"importId": "bad", "name": "caf\xe9", "roles": ["developer"]}\n')  # line 5
        out.writelines(_line(n) for n in range(6, 9))
        out.write(b'{"importId": "long", "name": "' + b"x" * (8 << 20) + b'"}\n')  # line 9
        out.writelines(_line(n) for n in range(10, 12))
    done = _run("import", "--db", db, "--org", org, "--batch", "3", str(path))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    summary = json.loads(done.stdout)
    assert (summary["imported"], summary["skipped"], summary["refused"]) == (9, 0, 2)
    refused = done.stderr.splitlines()
    assert len(refused) == 2
    assert refused[0].startswith("keysvc: import: line 5: not UTF-8")
    assert refused[1] == "keysvc: import: line 9: longer than 1048576 bytes"
    exported = _run("export", "--db", db, "--org", org)
    assert exported.returncode == 0, exported.stderr
    names = {json.loads(line)["name"] for line in exported.stdout.splitlines()}
    assert names >= {f"r{n}" for n in (1, 2, 3, 4, 6, 7, 8, 10, 11)}


def test_an_export_keeps_a_keys_named_rate_limits(db: str, tmp_path: Path) -> None:
    org = _organization(db)
    path = tmp_path / "keys.jsonl"
    path.write_bytes(_line(1, ratelimits=[BURST]) + _line(2))
    done = _run("import", "--db", db, "--org", org, str(path))
    assert done.returncode == 0, done.stderr
    exported = _run("export", "--db", db, "--org", org)
    assert exported.returncode == 0, exported.stderr
    records = {r["name"]: r for r in map(json.loads, exported.stdout.splitlines())}
    assert records["r1"]["ratelimits"] == [BURST]
    assert "ratelimits" not in records["r2"]
