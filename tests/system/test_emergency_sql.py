"""Emergency SQL: an operator's direct edits of keys, their roles and roles, made on
the database file while a real server runs with its credential cache on, take
effect within 2 s (docs/SECURITY.md, "Emergency revocation")."""

import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server import Server, bootstrap, call

# How soon a hand edit must show, from its commit.
WITHIN_SECONDS = 2.0
VERIFY = "/v1/verify"
NEEDS = "/v1/verify?permission=reports:read"


def edit(db: Path, sql: str, *params: object) -> None:
    """``sql`` committed by a connection of its own, as the sqlite3 CLI would."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        conn.execute(sql, params)
    finally:
        conn.close()


def answer_after(server: Server, path: str, creds: dict[str, str], expected: int) -> int:
    """Ask until the answer is ``expected``, for WITHIN_SECONDS from now; the last status."""
    deadline = time.monotonic() + WITHIN_SECONDS
    while True:
        status, _ = call(server.base, path, creds)
        if status == expected or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def warm(server: Server, creds: dict[str, str], path: str = VERIFY) -> None:
    """Authenticate twice, so that the key is served from the cache."""
    for _ in range(2):
        assert call(server.base, path, creds)[0] == 200


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Server, dict[str, Any]]]:
    db = tmp_path / "keysvc.db"
    admin = bootstrap(db)
    with Server(db) as server:
        yield db, server, admin
        server.stop()


def new_key(server: Server, admin: dict[str, Any]) -> tuple[dict[str, str], str]:
    """A key whose only role is a new custom role granting reports:read; and that role."""
    org = admin["organizationId"]
    status, role = call(server.base, f"/v1/organizations/{org}/roles", admin, "POST",
                        {"name": f"reports {time.monotonic_ns()}",
                         "permissions": ["reports:read"]})  # fmt: skip
    assert status == 200, role
    role_id = role["result"]["id"]
    status, made = call(server.base, f"/v1/organizations/{org}/keys", admin, "POST",
                        {"name": "svc", "assignedRoleIds": [role_id]})  # fmt: skip
    assert status == 200, made
    result = made["result"]
    return {"keyId": result["keyId"], "keySecret": result["keySecret"],
            "id": result["key"]["id"]}, role_id  # fmt: skip


def test_a_key_disabled_or_deleted_by_hand_is_refused(
    served: tuple[Path, Server, dict[str, Any]],
) -> None:
    db, server, admin = served
    svc, _ = new_key(server, admin)
    warm(server, svc)
    edit(db, "update api_keys set state = 'disabled' where id = ?", svc["id"])
    assert answer_after(server, VERIFY, svc, 401) == 401
    edit(db, "update api_keys set state = 'enabled' where id = ?", svc["id"])
    assert answer_after(server, VERIFY, svc, 200) == 200

    warm(server, svc)
    edit(db, "delete from api_keys where id = ?", svc["id"])
    assert answer_after(server, VERIFY, svc, 401) == 401


def test_a_role_taken_from_a_key_by_hand_is_refused(
    served: tuple[Path, Server, dict[str, Any]],
) -> None:
    db, server, admin = served
    svc, role_id = new_key(server, admin)
    warm(server, svc, NEEDS)
    edit(db, "delete from key_roles where key_id = ? and role_id = ?", svc["id"], role_id)
    assert answer_after(server, NEEDS, svc, 403) == 403
    # Granted again by hand: that takes effect too.
    edit(db, "insert into key_roles (key_id, role_id) values (?, ?)", svc["id"], role_id)
    assert answer_after(server, NEEDS, svc, 200) == 200


def test_a_key_deleted_by_hand_takes_its_role_rows_along(
    served: tuple[Path, Server, dict[str, Any]],
) -> None:
    """The sqlite3 shell (and Python's sqlite3) run with foreign keys off, so the
    delete's cascade does not run there: without the schema's trigger the key's role
    rows would stay, and its role could never be deleted (409, still assigned)."""
    db, server, admin = served
    svc, role_id = new_key(server, admin)
    done = (
        subprocess.run(
            [
                "sqlite3",
                "-cmd",
                ".timeout 5000",
                str(db),
                f"delete from api_keys where id = '{svc['id']}';",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if shutil.which("sqlite3")
        else None
    )
    if done is None:
        edit(db, "delete from api_keys where id = ?", svc["id"])
    else:
        assert done.returncode == 0, done.stderr
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("pragma foreign_key_check").fetchall() == []
        assert conn.execute(
            "select count(*) from key_roles where key_id = ?", (svc["id"],)
        ).fetchone() == (0,)
    finally:
        conn.close()
    org = admin["organizationId"]
    status, body = call(server.base, f"/v1/organizations/{org}/roles/{role_id}", admin, "DELETE")
    assert status == 200, body


def test_a_role_narrowed_by_hand_is_refused(
    served: tuple[Path, Server, dict[str, Any]],
) -> None:
    db, server, admin = served
    svc, role_id = new_key(server, admin)
    warm(server, svc, NEEDS)
    edit(db, "update roles set permissions = '[\"reports:list\"]' where id = ?", role_id)
    assert answer_after(server, NEEDS, svc, 403) == 403


def test_used_at_by_hand_keeps_the_generation(tmp_path: Path) -> None:
    """Only a usedAt write, as the server makes each minute a key is used, leaves
    the generation alone: otherwise every busy key would drop every cache."""
    db = tmp_path / "keysvc.db"
    bootstrap(db)

    def generation() -> str:
        conn = sqlite3.connect(db)
        try:
            value: str = conn.execute(
                "select value from meta where name = 'auth_generation'"
            ).fetchone()[0]
            return value
        finally:
            conn.close()

    before = generation()
    edit(db, "update api_keys set used_at = '2026-01-01T00:00:00Z'")
    assert generation() == before
    edit(db, "update api_keys set name = 'renamed'")
    assert int(generation()) > int(before)
