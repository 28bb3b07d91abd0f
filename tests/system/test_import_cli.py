"""``keysvc import`` and ``keysvc export`` on both backends, as an operator runs them:
a JSON Lines file imported in batches with refused lines named by number, a second
run importing nothing twice, the imported tokens verifying on a served instance as
``Authorization: Bearer``, and an export of public fields only that a second keysvc
imports as public data (keys that open with nothing until rotated)."""

import hashlib
import io
import json
import os
import secrets
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from keysvc.cli import porting
from keysvc.config import build_settings
from keysvc.db import imports as import_sql
from tests.handsql import hand_sql, hand_value
from tests.postgres import PEPPER
from tests.server import Server, bootstrap, call, keysvc, status_of

ENV = {"KEYSVC_PEPPER": PEPPER.hex()}


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "keysvc", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **ENV},
        check=False,
    )


def _record(n: int, token: str) -> dict[str, Any]:
    digest = hashlib.sha256(token.encode()).hexdigest()
    return {
        "importId": f"legacy-{n}",
        "name": f"legacy {n}",
        "roles": ["developer"],
        "externalId": f"user-{n}",
        "tokenHash": {"algorithm": "sha256", "encoding": "hex", "value": digest},
    }


def _imported(tmp_path: Path, count: int, *options: str) -> tuple[str, str, Path]:
    """A new SQLite database with ``count`` keys imported by ``keysvc import`` with
    ``options``: its path, the organization and the file."""
    db = str(tmp_path / "keysvc.db")
    org = bootstrap(db, env=ENV)["organizationId"]
    source = tmp_path / "keys.jsonl"
    lines = [json.dumps(_record(n, secrets.token_urlsafe(24))) for n in range(count)]
    source.write_text("\n".join(lines) + "\n")
    larger = {**ENV, "KEYSVC_MAX_KEYS_PER_ORG": "50000"}
    imported = keysvc("import", "--db", db, "--org", org, *options, str(source), env=larger)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["imported"] == count
    return db, org, source


def test_the_default_batch_is_smaller_on_postgresql(db: str, tmp_path: Path) -> None:
    """A batch holds the write lock every instance's writes take for as long as it is
    written (rt41 R5): on PostgreSQL the default is 1,000 records, on SQLite 10,000.
    Each batch is one key_import activity."""
    org = bootstrap(db, env=ENV)["organizationId"]
    source = tmp_path / "keys.jsonl"
    lines = [json.dumps(_record(n, secrets.token_urlsafe(24))) for n in range(2_500)]
    source.write_text("\n".join(lines) + "\n")
    larger = {**ENV, "KEYSVC_MAX_KEYS_PER_ORG": "5000"}
    imported = keysvc("import", "--db", db, "--org", org, str(source), env=larger)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["imported"] == 2_500
    sql = "select count(*) from activities where type = 'key_import'"
    batches = hand_value(build_settings({"db_path": db}, env=ENV), sql)
    assert batches == (3 if db.startswith("postgres") else 1)


def test_import_then_serve_then_export_round_trip(db: str, tmp_path: Path) -> None:
    admin = bootstrap(db, env=ENV)
    org = admin["organizationId"]
    tokens = [f"sk_live_{secrets.token_urlsafe(24)}" for _ in range(25)]
    lines = [json.dumps(_record(n, token)) for n, token in enumerate(tokens)]
    lines.insert(3, "{not json")
    lines.insert(7, json.dumps({**_record(99, "x"), "roles": ["emperor"]}))
    lines.insert(10, "")
    source = tmp_path / "keys.jsonl"
    source.write_text("\n".join(lines) + "\n")

    first = _run("import", "--db", db, "--org", org, "--batch", "10", str(source))
    assert first.returncode == 1, first.stderr
    summary = json.loads(first.stdout)
    assert (summary["imported"], summary["skipped"], summary["refused"]) == (25, 0, 2)
    refused = first.stderr.splitlines()
    assert refused[0].startswith("keysvc: import: line 4: not JSON")
    assert refused[1].startswith("keysvc: import: line 8: roles.0: must be one of")
    assert len(refused) == 2
    # The same file again: nothing twice, quietly; from standard input this time.
    again = _run("import", "--db", db, "--org", org, "-", stdin=source.read_text())
    assert json.loads(again.stdout)["skipped"] == 25
    assert json.loads(again.stdout)["imported"] == 0

    with Server(db, env=ENV) as server:  # type: ignore[arg-type]
        for token in tokens[:5]:
            assert (
                status_of(server.base + "/v1/verify", {"Authorization": f"Bearer {token}"}) == 200
            )
        assert status_of(server.base + "/v1/verify", {"Authorization": "Bearer nope"}) == 401
        keys = f"/v1/organizations/{org}/keys"
        listed = call(server.base, keys + "?limit=100", admin)[1]["result"]
        assert len(listed) == 26

    exported = _run("export", "--db", db, "--org", org)
    assert exported.returncode == 0, exported.stderr
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert len(records) == 26
    assert all("tokenHash" not in r and "hashData" not in r for r in records)
    text = exported.stdout
    assert admin["keySecret"] not in text and admin["keyId"] not in text
    for token in tokens:
        assert hashlib.sha256(token.encode()).hexdigest() not in text
    by_name = {r["name"]: r for r in records}
    assert by_name["legacy 0"]["externalId"] == "user-0"

    # Into another keysvc: as public data, the keys open with nothing until rotated.
    other = tmp_path / "other.db"
    other_admin = bootstrap(other, env=ENV)
    moved = _run(
        "import", "--db", str(other), "--org", other_admin["organizationId"], "-", stdin=text
    )
    assert json.loads(moved.stdout)["imported"] == 26, moved.stderr
    with Server(other, env=ENV) as server:
        for token in tokens[:3]:
            assert (
                status_of(server.base + "/v1/verify", {"Authorization": f"Bearer {token}"}) == 401
            )
    verified = _run("audit", "verify", "--db", db)
    assert verified.returncode == 0, verified.stderr


def test_import_refuses_an_unknown_organization(db: str, tmp_path: Path) -> None:
    bootstrap(db, env=ENV)
    source = tmp_path / "keys.jsonl"
    source.write_text(json.dumps(_record(1, "t")) + "\n")
    done = _run("import", "--db", db, "--org", "00000000-0000-4000-8000-000000000000", str(source))
    assert done.returncode == 2
    assert "no organization 00000000-0000-4000-8000-000000000000" in done.stderr


def test_the_default_batch_holds_ten_thousand_lines(tmp_path: Path) -> None:
    # Issue 37's speed: the CLI's transactions are larger than a request's 1,000 (fewer
    # commits, fewer pages a key), still one activity a batch with its count. 10,000 by
    # default on SQLite, where a batch holds the write lock a server's writes wait for
    # (rt60 F1: 20,000 held another tenant's disable past the busy timeout); up to
    # 20,000 asked for.
    db, org, source = _imported(tmp_path, 12_000)
    sql = "select json_extract(after, '$.count') from activities where type = 'key_import'"
    with sqlite3.connect(db) as conn:
        counts = conn.execute(sql + " order by org_seq").fetchall()
    assert counts == [(10_000,), (2_000,)]
    too_many = _run("import", "--db", db, "--org", org, "--batch", "20001", str(source))
    assert too_many.returncode != 0
    assert "--batch must be from 1 to 20000" in too_many.stderr
    other = str(tmp_path / "other.db")
    other_org = bootstrap(other, env=ENV)["organizationId"]
    larger = {**ENV, "KEYSVC_MAX_KEYS_PER_ORG": "50000"}
    whole = keysvc(
        "import", "--db", other, "--org", other_org, "--batch", "20000", str(source), env=larger
    )
    assert whole.returncode == 0, whole.stderr
    with sqlite3.connect(other) as conn:
        assert conn.execute(sql).fetchall() == [(12_000,)]


def test_an_import_leaves_its_keys_in_the_database_file_not_the_log(tmp_path: Path) -> None:
    # Issue 37's speed: the CLI's connection copies its write-ahead log less often
    # (keysvc.db.imports.LONG_WAL); when the import ends, all of it is in the database
    # file itself, read here with the log ignored (immutable).
    db, _, _ = _imported(tmp_path, 2500, "--batch", "1000")
    wal = Path(db + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0
    with sqlite3.connect(f"file:{db}?immutable=1", uri=True) as conn:
        (count,) = conn.execute("select count(*) from key_imports").fetchone()
        (keys,) = conn.execute("select count(*) from api_keys").fetchone()
    assert count == 2500 and keys == 2501  # and the bootstrap's admin key


def _written(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


TAKEN = "tokenHash: a key with this token already exists"


def test_a_taken_token_is_refused_by_its_line_and_the_rest_of_its_batch_goes_in_once(
    db: str, tmp_path: Path
) -> None:
    # The operator's batches are first written without looking their key IDs up: the
    # key-ID index refuses a taken one, that transaction is rolled back whole, and the
    # batch is written again with each looked up. Nothing of the first attempt stays.
    org = bootstrap(db, env=ENV)["organizationId"]
    tokens = [secrets.token_urlsafe(24) for _ in range(6)]
    first = _written(tmp_path / "a.jsonl", [_record(n, t) for n, t in enumerate(tokens)])
    assert _run("import", "--db", db, "--org", org, "--batch", "3", str(first)).returncode == 0
    later = [{**_record(n, secrets.token_urlsafe(24)), "importId": f"later-{n}"} for n in range(6)]
    later[1] = {**_record(1, tokens[1]), "importId": "later-1"}
    later[4] = {**_record(4, tokens[4]), "importId": "later-4"}
    second = _run(
        "import",
        "--db",
        db,
        "--org",
        org,
        "--batch",
        "3",
        str(_written(tmp_path / "b.jsonl", later)),
    )
    assert second.returncode == 1, second.stderr
    summary = json.loads(second.stdout)
    assert (summary["imported"], summary["skipped"], summary["refused"]) == (4, 0, 2)
    assert second.stderr.splitlines() == [
        f"keysvc: import: line 2: {TAKEN}",
        f"keysvc: import: line 5: {TAKEN}",
    ]
    settings = build_settings({"db_path": db}, env=ENV)
    counts = hand_sql(
        settings,
        "select after from activities where type = 'key_import' order by org_seq",
    )
    assert [json.loads(after)["count"] for (after,) in counts] == [3, 3, 2, 2]
    assert hand_value(settings, "select count(*) from api_keys") == 1 + 6 + 4
    assert hand_value(settings, "select key_count from organizations where id = ?", org) == 11
    assert _run("audit", "verify", "--db", db).returncode == 0
    # The refused records' importIds were not taken: with tokens of their own, they go in.
    for n in (1, 4):
        later[n] = {**_record(n, secrets.token_urlsafe(24)), "importId": f"later-{n}"}
    third = _run("import", "--db", db, "--org", org, str(_written(tmp_path / "c.jsonl", later)))
    assert json.loads(third.stdout)["imported"] == 2, third.stderr


def _previous_of_a_key(db: str, tmp_path: Path) -> tuple[str, str]:
    """A database whose one imported key answers to ``token`` as the key ID a rotation
    replaced (as ``keysvc.keys.rotate_key`` leaves it, its new key ID another): the
    organization and the token."""
    org = bootstrap(db, env=ENV)["organizationId"]
    token = secrets.token_urlsafe(24)
    first = _written(tmp_path / "a.jsonl", [_record(0, token)])
    assert _run("import", "--db", db, "--org", org, str(first)).returncode == 0
    hand_sql(
        build_settings({"db_path": db}, env=ENV),
        "update api_keys set previous_key_id_hash = key_id_hash, key_id_hash = ?"
        " where name = 'legacy 0'",
        secrets.token_bytes(32),
    )
    return org, token


def _taking(token: str) -> list[dict[str, Any]]:
    records = [{**_record(n, secrets.token_urlsafe(24)), "importId": f"new-{n}"} for n in range(3)]
    records[1] = {**_record(1, token), "importId": "new-1"}
    return records


def test_a_key_id_a_rotation_replaced_is_refused_by_its_line(db: str, tmp_path: Path) -> None:
    org, token = _previous_of_a_key(db, tmp_path)
    source = _written(tmp_path / "b.jsonl", _taking(token))
    done = _run("import", "--db", db, "--org", org, str(source))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"keysvc: import: line 2: {TAKEN}"]
    assert json.loads(done.stdout)["imported"] == 2


def test_previous_key_ids_past_the_read_are_looked_up_in_their_index(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # More previous key IDs than PREVIOUS_READ: the batch's are looked up one by one in
    # their index. The command run here, in this process (a batch: planned here too).
    org, token = _previous_of_a_key(db, tmp_path)
    monkeypatch.setattr(import_sql, "PREVIOUS_READ", 0)
    source = _written(tmp_path / "b.jsonl", _taking(token))
    errors = io.StringIO()
    settings = build_settings({"db_path": db}, env=ENV)
    with source.open("rb") as stream:
        summary, code = porting.import_file(settings, org, stream, 10, errors)
    assert (code, summary["imported"]) == (1, 2)
    assert errors.getvalue().splitlines() == [f"keysvc: import: line 2: {TAKEN}"]
