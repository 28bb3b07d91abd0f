"""``keysvc migrate``: a SQLite database made through the real API of a real server
(two organizations, custom roles, keys of every kind, usage, activities, a webhook
with pending deliveries) copied into PostgreSQL, then served there by a real
``keysvc serve``: every credential answers as before, every read answers the same
JSON, the audit log verifies, and the pending deliveries arrive, signed with the
secret the pepper derives. And what migrate refuses, or rolls back, leaves the
target as it was."""

import asyncio
import json
import secrets
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from keysvc.db.postgres.fromsqlite import TABLES
from keysvc.db.sqlite.migrations import schema_version
from tests.helpers import hash_data
from tests.postgres import PEPPER, Postgres
from tests.receiver import Receiver, signature_valid
from tests.server import Server, bootstrap, call, free_port, keysvc

ENV = {
    "KEYSVC_WEBHOOK_ALLOW_PRIVATE": "1",
    "KEYSVC_WEBHOOK_RETRY_SECONDS": "0.5",
    "KEYSVC_WEBHOOK_TIMEOUT": "30",
    "KEYSVC_PEPPER": "",  # the SQLite database's pepper is its file's
    "KEYSVC_API_TOKEN_IMPORT": "1",  # a token-hash key imported through the API
}
DAY = 86_400
Creds = dict[str, str]


@dataclass
class Source:
    """The SQLite database, stopped, and what its server answered."""

    db: Path
    reader: Creds  # an admin key the reads of the first organization are made with
    reader_id: str
    receiver_port: int
    webhook_secret: str
    # Each credential's name, its keyId and keySecret, and verify's answer on SQLite.
    verified: dict[str, tuple[Creds, int, str | None]] = field(default_factory=dict)
    # Each GET's path, and its body on SQLite.
    reads: dict[str, Any] = field(default_factory=dict)
    org_admins: list[Creds] = field(default_factory=list)

    def reader_of(self, path: str) -> Creds:
        """The first organization's reader, or the second's admin."""
        second = self.org_admins[1]
        return second if second["organizationId"] in path else self.reader

    @property
    def readers(self) -> set[str]:
        return {self.reader_id, self.org_admins[1]["id"]}


def _ok(base: str, path: str, creds: Creds, method: str = "GET", body: Any = None) -> Any:
    status, answer = call(base, path, creds, method, body)
    assert status == 200, (method, path, answer)
    return answer.get("result")


def _creds(made: dict[str, Any]) -> Creds:
    return {"keyId": made["keyId"], "keySecret": made["keySecret"]}


def _scrubbed(body: Any, readers: set[str]) -> Any:
    """``body`` without what differs between two reads by design: the requestId, the
    usedAt of the keys the reads are made with, and a webhook's failingSince (its
    delivery state: its pending deliveries fail, then reach the receiver, meanwhile)."""
    if isinstance(body, list):
        return [_scrubbed(item, readers) for item in body]
    if not isinstance(body, dict):
        return body
    drop = {"requestId"} | ({"usedAt"} if body.get("id") in readers else set())
    if "failingSince" in body and "expiringDays" in body:
        drop.add("failingSince")
    return {name: _scrubbed(value, readers) for name, value in body.items() if name not in drop}


def _populate(base: str, admins: list[Creds], receiver_port: int, source: Source) -> list[str]:
    """Everything the copy must carry, made through the API; the GET paths to compare."""
    org = f"/v1/organizations/{admins[0]['organizationId']}"
    hook = {
        "url": f"http://127.0.0.1:{receiver_port}/hooks",
        "expiringDays": 7,
        "events": ["key.created", "key.updated", "key.deleted", "key.expiring"],
    }
    made = _ok(base, org + "/webhooks", admins[0], "POST", hook)
    source.webhook_secret = made["secret"]
    role = _ok(
        base, org + "/roles", admins[0], "POST", {"name": "auditor", "permissions": ["keys:read"]}
    )
    soon = (datetime.now(UTC) + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    bodies = {
        "plain": {"name": "plain", "roles": ["developer"]},
        "custom": {
            "name": "custom",
            "assignedRoleIds": [role["id"]],
            "expireAt": soon,
            "ipAccessList": [{"source": "127.0.0.1/32", "description": "loopback"}],
            "rateLimit": {"limit": 1000, "windowSeconds": 60},
        },
        "own": {
            "name": "own",
            "roles": ["developer"],
            "hashData": hash_data("migrate-own-key-id-0001", "migrate-own-secret-0001"),
        },
        "disabled": {"name": "disabled", "roles": ["developer"]},
        "rotated": {"name": "rotated", "roles": ["developer"]},
        "deleted": {"name": "deleted", "roles": ["developer"]},
        "reader": {"name": "reader", "roles": ["admin"]},
        "leaked": {"name": "leaked", "roles": ["developer"]},
        # Issue 29's details, and credits for two of its three verifies below: the
        # third is refused and counted (key_usage_credits).
        "credited": {
            "name": "credited",
            "roles": ["developer"],
            "externalId": "cust_7",
            "meta": {"plan": "pro"},
            # No refill: the refusal's message, compared after the copy, would name
            # the seconds until it.
            "credits": {"remaining": 2},
        },
    }
    ids, creds = {}, {}
    for name, body in bodies.items():
        result = _ok(base, org + "/keys", admins[0], "POST", body)
        ids[name] = result["key"]["id"]
        if name == "own":
            creds[name] = {
                "keyId": "migrate-own-key-id-0001",
                "keySecret": "migrate-own-secret-0001",
            }
        else:
            creds[name] = _creds(result)
    keys = f"{org}/keys/"
    _ok(base, keys + ids["disabled"], admins[0], "PATCH", {"state": "disabled"})
    rotated = _ok(
        base, keys + ids["rotated"] + "/rotate", admins[0], "POST", {"gracePeriodSeconds": DAY}
    )
    creds["rotated (previous)"], creds["rotated"] = creds["rotated"], _creds(rotated)
    _ok(base, keys + ids["deleted"], admins[0], "DELETE")
    # Reported leaked (a leak_reports row), by its secret alone: the key is disabled.
    leaked = {"secret": creds["leaked"]["keySecret"]}
    _ok(base, "/v1/keys/revoke-leaked", admins[0], "POST", leaked)
    # An imported key (a key_imports row), from a bearer token's hash (issue 37).
    digest = "ab" * 32
    record = {"importId": "old-1", "name": "imported", "roles": ["developer"]}
    token_hash = {"algorithm": "sha256", "encoding": "hex", "value": digest}
    imported = {"keys": [{**record, "tokenHash": token_hash}]}
    _ok(base, org + "/keys/import", admins[0], "POST", imported)
    other = f"/v1/organizations/{admins[1]['organizationId']}"
    _ok(
        base,
        other + "/roles",
        admins[1],
        "POST",
        {"name": "ops", "permissions": ["keys:read", "keys:update"]},
    )
    creds["second org"] = _creds(
        _ok(base, other + "/keys", admins[1], "POST", {"name": "theirs", "roles": ["developer"]})
    )
    for name, cred in creds.items():  # usage, and verify's answers as they were
        for _ in range(3):
            status, answer = call(base, "/v1/verify", cred)
        source.verified[name] = (cred, status, answer.get("error"))
    source.reader, source.reader_id = creds["reader"], ids["reader"]
    since = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:00:00Z")
    until = (datetime.now(UTC) + timedelta(hours=2)).strftime("%Y-%m-%dT%H:00:00Z")
    usage = f"/usage?from={since}&to={until}&granularity=hour"
    paths = [
        org + "/keys?limit=250",
        org + "/roles",
        org + "/activities?limit=250",
        org + "/webhooks",
        other + "/keys",
        other + "/roles",
        other + "/activities",
    ]
    for name, key_id in ids.items():
        if name not in ("deleted", "reader"):
            paths += [keys + key_id, keys + key_id + usage]
    return paths


_PENDING_REPORT = """
    insert into pending_leak_reports (secret_hash, actor_type, actor_details, action, reported_at)
    values (?, 'system', 'revoke-leaked', 'disable', '2026-01-01T00:00:00.000000Z')
"""
_BACKDATE = """
    update activities set created_at = '2001-01-01T00:00:00.000000Z'
    where organization_id = ? and org_seq = 1
"""


def _wait_for_anchor(db: Path) -> None:
    for _ in range(100):
        with sqlite3.connect(db) as conn:
            if conn.execute("select count(*) from activity_anchors").fetchone()[0]:
                return
        time.sleep(0.1)
    raise AssertionError("the retention pruned nothing")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    """Made once, stopped with SIGTERM (which writes the usage counts), then served
    again only to read what the copy must answer alike."""
    db = tmp_path_factory.mktemp("source") / "keysvc.db"
    admins = []
    for name in ("first", "second"):
        done = keysvc("bootstrap", "--db", str(db), "--org-name", name, env=ENV)
        assert done.returncode == 0, done.stderr
        admins.append(json.loads(done.stdout))
    made = Source(db, {}, "", free_port(), "", org_admins=admins)
    with Server(db, ENV) as server:
        paths = _populate(server.base, admins, made.receiver_port, made)
        assert server.stop() < 10
    # The second organization's first record, dated long ago, is pruned by a retention
    # of a day, so that the copy carries an anchor too (keysvc.db.retention). Its hash
    # no longer matches its date, but it is gone once pruned, and the chain starts after it.
    with sqlite3.connect(db) as conn:
        conn.execute(_BACKDATE, (admins[1]["organizationId"],))
    with Server(db, {**ENV, "KEYSVC_ACTIVITY_RETENTION_DAYS": "1"}) as server:
        _wait_for_anchor(db)
        for path in paths:
            status, body = call(server.base, path, made.reader_of(path))
            assert status == 200, (path, body)
            made.reads[path] = body
        assert server.stop() < 10
    # A revoke-by-secret report received and not acted on yet when its server stopped
    # (no key answers to it): the copy carries it, to be acted on by the next start.
    with sqlite3.connect(db) as conn:
        conn.execute(_PENDING_REPORT, (secrets.token_bytes(32),))
    return made


def copy_of(source: Source, folder: Path) -> Path:
    """The source database and its pepper file, copied into ``folder``."""
    db = folder / "keysvc.db"
    for suffix in ("", "-wal", ".pepper"):
        if Path(str(source.db) + suffix).exists():
            shutil.copy2(str(source.db) + suffix, str(db) + suffix)
    return db


def pepper_of(db: Path) -> str:
    return Path(str(db) + ".pepper").read_text().strip()


def migrate(db: Path, url: str, pepper: str = "") -> Any:
    return keysvc("migrate", "--from", str(db), "--to", url, env={"KEYSVC_PEPPER": pepper})


def rows_of(postgres: Postgres, database: str) -> dict[str, int]:
    """Every copied table's row count on PostgreSQL."""
    sql = " union all ".join(f"select '{t}', count(*) from {t}" for t in TABLES)
    return {name: int(count) for name, count in postgres.psql(database, sql)}


@pytest.fixture
def url(postgres: Postgres, pg_database: str) -> str:
    return postgres.url(pg_database)


def _pending(db: Path) -> set[str]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute("select event_id from webhook_deliveries where state = 'pending'")
        return {row[0] for row in rows}
    finally:
        conn.close()


def _check_served(source: Source, base: str) -> None:
    for path, before in source.reads.items():
        status, after = call(base, path, source.reader_of(path))
        assert status == 200, (path, after)
        assert _scrubbed(after, source.readers) == _scrubbed(before, source.readers), path
    for name, (cred, status, error) in source.verified.items():
        answer = call(base, "/v1/verify", cred)
        assert (answer[0], answer[1].get("error")) == (status, error), name


async def test_a_migrated_database_serves_as_before(
    source: Source, tmp_path: Path, url: str
) -> None:
    db = copy_of(source, tmp_path)
    pending = _pending(db)
    assert pending  # the receiver was never up
    done = migrate(db, url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == list(TABLES)
    assert all(line.endswith("rows copied, counts match") for line in lines)
    assert "keySecret" not in done.stdout + done.stderr
    receiver = await Receiver(port=source.receiver_port).start()
    env = {**ENV, "KEYSVC_PEPPER": pepper_of(db)}
    try:
        with Server(url, env) as server:  # type: ignore[arg-type]
            await asyncio.to_thread(_check_served, source, server.base)
            admin = source.org_admins[0]
            org = f"/v1/organizations/{admin['organizationId']}"
            made = await asyncio.to_thread(
                _ok,
                server.base,
                org + "/keys",
                admin,
                "POST",
                {"name": "new", "roles": ["developer"]},
            )  # the copied identities were moved past: a new key takes a new seq
            assert call(server.base, "/v1/verify", _creds(made))[0] == 200
            got = await receiver.wait_for(
                lambda got: {r.event["id"] for r in got if r.status == 204} >= pending,
                timeout=120,
            )
            assert server.stop() < 10
    finally:
        await receiver.stop()
    assert all(signature_valid(source.webhook_secret, r) for r in got)
    audited = keysvc("audit", "verify", "--db", url, env=env)
    assert audited.returncode == 0, audited.stderr
    assert audited.stdout.startswith("audit log intact:")


@dataclass(frozen=True)
class Target:
    """The test's PostgreSQL database, as a migration leaves it."""

    postgres: Postgres
    database: str

    def rows(self) -> dict[str, int]:
        return rows_of(self.postgres, self.database)

    def refuses(self, db: Path, says: str, pepper: str = "", code: int = 2) -> str:
        """Migrate ``db`` here: refused with ``code`` and one line that says ``says``,
        and not a row changed."""
        before = self.rows()
        done = migrate(db, self.postgres.url(self.database), pepper)
        assert done.returncode == code, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr, done.stderr
        assert self.rows() == before
        return str(done.stderr)


@pytest.fixture
def target(postgres: Postgres, pg_database: str) -> Target:
    return Target(postgres, pg_database)


def test_a_target_that_holds_keys_is_refused_and_left_as_it_was(
    source: Source, tmp_path: Path, url: str, target: Target
) -> None:
    done = keysvc("bootstrap", "--db", url, env={"KEYSVC_PEPPER": PEPPER.hex()})
    assert done.returncode == 0, done.stderr
    said = target.refuses(copy_of(source, tmp_path), "is not empty")
    assert said == (
        "keysvc: migrate: the target database is not empty (table organizations has rows):"
        " migrate into a new database; nothing was written\n"
    )


def test_a_second_migration_into_the_same_target_is_refused(
    source: Source, tmp_path: Path, url: str, target: Target
) -> None:
    db = copy_of(source, tmp_path)
    assert migrate(db, url).returncode == 0
    target.refuses(db, "is not empty")


@pytest.mark.parametrize(
    ("file", "configured", "says"),
    [
        (True, "f" * 64, "KEYSVC_PEPPER differs from the pepper file"),
        (False, "f" * 64, "the pepper does not match database"),
        (False, "", "no pepper:"),
    ],
)
def test_a_wrong_or_missing_pepper_is_refused(
    source: Source, tmp_path: Path, target: Target, file: bool, configured: str, says: str
) -> None:
    db = copy_of(source, tmp_path)
    if not file:
        Path(str(db) + ".pepper").unlink()
    target.refuses(db, says, configured)


def test_the_pepper_may_come_from_keysvc_pepper_alone(
    source: Source, tmp_path: Path, url: str
) -> None:
    db = copy_of(source, tmp_path)
    pepper = Path(str(db) + ".pepper")
    value = pepper_of(db)
    pepper.unlink()
    done = migrate(db, url, value)
    assert done.returncode == 0, done.stderr


def _altered(db: Path, statement: str) -> None:
    conn = sqlite3.connect(db)
    try:
        conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("statement", "says"),
    [
        (f"pragma user_version = {schema_version() - 1}", "start `keysvc serve` on it once"),
        ("create table future_things (x integer)", "does not copy: future_things"),
    ],
)
def test_a_source_of_another_schema_is_refused(
    source: Source, tmp_path: Path, target: Target, statement: str, says: str
) -> None:
    db = copy_of(source, tmp_path)
    _altered(db, statement)
    target.refuses(db, says)


def test_a_count_that_differs_rolls_everything_back(
    source: Source, tmp_path: Path, target: Target
) -> None:
    """A trigger on the target drops every usage row the copy writes: the counts
    differ, and nothing of the copy is kept."""
    target.postgres.psql(
        target.database,
        "create function drop_row() returns trigger language plpgsql as"
        " $$ begin return null; end $$;"
        " create trigger drop_usage before insert on key_usage"
        " for each row execute function drop_row();",
    )
    said = target.refuses(copy_of(source, tmp_path), "rolled back", code=1)
    assert said.startswith("keysvc: migrate: table key_usage:"), said


async def _target_rows(url: str) -> dict[str, list[tuple[Any, ...]]]:
    conn = await asyncpg.connect(url)
    try:
        return {t: [tuple(row) for row in await conn.fetch(f"select * from {t}")] for t in TABLES}
    finally:
        await conn.close()


async def test_every_row_and_column_is_copied_as_it_was(
    source: Source, tmp_path: Path, url: str
) -> None:
    """Table by table, the same rows with the same values (blobs as bytes, text as
    text, integers and reals as numbers), meta's own included; PostgreSQL keeps only
    its schema version besides."""
    db = copy_of(source, tmp_path)
    conn = sqlite3.connect(db)
    try:
        before = {t: conn.execute(f"select * from {t}").fetchall() for t in TABLES}
    finally:
        conn.close()
    assert migrate(db, url).returncode == 0
    after = await _target_rows(url)
    version = ("schema_version", str(schema_version()))
    assert version in after["meta"]
    after["meta"].remove(version)
    for table in TABLES:
        assert sorted(after[table], key=repr) == sorted(before[table], key=repr), table
    assert all(before[t] for t in TABLES)  # every table has rows to copy


def test_a_serving_database_is_copied_as_of_one_moment(tmp_path: Path, url: str) -> None:
    """While a server creates keys (each with its activity and its chain's head), the
    copy reads one snapshot: its counts match, and the moved log verifies, which
    tables read at different moments would not."""
    db = tmp_path / "keysvc.db"
    admin = bootstrap(db)
    keys = f"/v1/organizations/{admin['organizationId']}/keys"
    made, stop = threading.Semaphore(0), threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            call(server.base, keys, admin, "POST", {"name": f"w{n}", "roles": ["developer"]})
            made.release()

    with Server(db, ENV) as server:
        writer = threading.Thread(target=write)
        writer.start()
        try:
            for _ in range(20):  # writes are under way before and during the copy
                assert made.acquire(timeout=30)
            done = migrate(db, url)
        finally:
            stop.set()
            writer.join(timeout=30)
    assert done.returncode == 0, done.stderr
    audited = keysvc("audit", "verify", "--db", url, env={"KEYSVC_PEPPER": pepper_of(db)})
    assert audited.returncode == 0, audited.stderr


@pytest.mark.parametrize("to", ["elsewhere.db", "sqlite:///elsewhere.db"])
def test_it_copies_a_file_into_a_url_only(source: Source, tmp_path: Path, to: str) -> None:
    done = migrate(copy_of(source, tmp_path), to)
    assert done.returncode == 2
    assert done.stderr == (
        "keysvc: migrate copies a SQLite file (--from PATH) into PostgreSQL"
        " (--to postgresql://...)\n"
    )
    assert not (tmp_path / "elsewhere.db").exists()
