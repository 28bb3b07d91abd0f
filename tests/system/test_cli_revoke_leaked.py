"""``keysvc revoke-leaked``: the operator's form of revoke-by-secret, the secret read from
standard input (never argv, which ps shows): the key is disabled and the report
recorded, a report again records nothing, a miss is said as such, and the log still
verifies."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.server import bootstrap, keysvc


def _revoke(db: Path, stdin: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keysvc", "revoke-leaked", "--db", str(db), *extra],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
        check=False,
    )


def _rows(db: Path, sql: str, *params: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, params).fetchall()


def test_revoke_leaked_reads_the_secret_from_stdin(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    first = bootstrap(db)
    minted = keysvc("admin-key", "--db", str(db))
    assert minted.returncode == 0, minted.stderr
    leaked = json.loads(minted.stdout)
    reports = "select after from activities where type = 'key_leaked'"

    done = _revoke(db, leaked["keySecret"] + "\n")
    assert (done.returncode, json.loads(done.stdout)) == (0, {"matched": True}), done.stderr
    assert leaked["keySecret"] not in done.stdout + done.stderr
    states = dict(_rows(db, "select id, state from api_keys"))
    assert states == {leaked["id"]: "disabled", first["id"]: "enabled"}
    (after,) = _rows(db, reports)
    assert json.loads(str(after[0])) == {
        "reporter": "cli", "action": "disabled", "credential": "current",
    }  # fmt: skip

    again = _revoke(db, leaked["keySecret"])
    assert (again.returncode, json.loads(again.stdout)) == (0, {"matched": True})
    assert len(_rows(db, reports)) == 1
    miss = _revoke(db, "keysvc_" + "A" * 42 + "\n")
    assert (miss.returncode, json.loads(miss.stdout)) == (0, {"matched": False})
    assert dict(_rows(db, "select id, state from api_keys"))[first["id"]] == "enabled"

    verified = keysvc("audit", "verify", "--db", str(db))
    assert verified.returncode == 0, verified.stderr


def test_the_secret_is_never_an_argument(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    created = bootstrap(db)
    empty = _revoke(db, "")
    assert empty.returncode == 2
    assert empty.stderr == (
        "keysvc: revoke-leaked: give the secret on standard input, one line (not as an argument)\n"
    )
    as_argument = _revoke(db, "", created["keySecret"])
    assert as_argument.returncode == 2
    assert "unrecognized arguments" in as_argument.stderr
    too_long = _revoke(db, "x" * 5000)
    assert too_long.returncode == 2
    assert "over 4096 characters" in too_long.stderr
    assert _rows(db, "select state from api_keys") == [("enabled",)]
    missing = _revoke(tmp_path / "none.db", created["keySecret"])
    assert missing.returncode == 2
    assert not (tmp_path / "none.db").exists()


def test_blanks_around_the_secret_are_trimmed_as_the_api_trims_them(tmp_path: Path) -> None:
    # The API's side: tests/api/test_revocation_quota.py, a pasted secret with blanks.
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    minted = keysvc("admin-key", "--db", str(db))
    leaked = json.loads(minted.stdout)
    done = _revoke(db, "  \t" + leaked["keySecret"] + " \r\n")
    assert (done.returncode, json.loads(done.stdout)) == (0, {"matched": True}), done.stderr
    assert dict(_rows(db, "select id, state from api_keys"))[leaked["id"]] == "disabled"
