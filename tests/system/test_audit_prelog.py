"""A database from before the activity log, holding custom roles and keys that hold
them: the first start records each as a create by ``system`` ("existed before the
activity log"), so ``keysvc audit verify`` replays them rather than taking them for
keys and roles written behind the log's back."""

import sqlite3
from pathlib import Path

from keysvc.db.sqlite.migrations import MIGRATIONS
from tests.rewind import UNDO_WEBHOOK_BINDING
from tests.server import bootstrap, keysvc

ROLE = "66666666-7777-4888-8999-000000000000"


def test_what_existed_before_the_log_is_recorded_at_its_seal(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    log_step = next(n for n, step in enumerate(MIGRATIONS) if "exists activities (" in step)
    conn = sqlite3.connect(db)
    try:
        with conn:
            (key_id,) = conn.execute("select id from api_keys").fetchone()
            conn.execute(
                "insert into roles (id, organization_id, name, type, permissions, created_at,"
                " updated_at) select ?, id, 'ops', 'custom', '[\"reports:read\"]', created_at,"
                " created_at from organizations",
                (ROLE,),
            )
            conn.execute("insert into key_roles (key_id, role_id) values (?, ?)", (key_id, ROLE))
        # The database as it was before the log's step (the steps after it make their
        # tables only if they are missing).
        conn.executescript(
            "drop table activities; drop table activity_heads;"
            f" {UNDO_WEBHOOK_BINDING} pragma user_version = {log_step + 1};"
        )
    finally:
        conn.close()
    done = keysvc("admin-key", "--db", str(db))
    assert done.returncode == 0, done.stderr
    verified = keysvc("audit", "verify", "--db", str(db))
    assert verified.returncode == 0, verified.stderr
    with sqlite3.connect(db) as conn:
        records = conn.execute(
            "select type, target_key_id, target_role_id, actor_details from activities"
            " order by org_seq"
        ).fetchall()
    pre_log = "existed before the activity log"
    assert records[:2] == [
        ("role_create", None, ROLE, pre_log),
        ("key_create", key_id, None, pre_log),
    ]
    assert [row[0] for row in records[2:]] == ["key_create"]
    # Once sealed, a key added behind the log's back is caught like any other.
    with sqlite3.connect(db) as conn:
        conn.execute("delete from key_roles where key_id = ? and role_id = ?", (key_id, ROLE))
    caught = keysvc("audit", "verify", "--db", str(db))
    assert caught.returncode == 1
    assert f"key {key_id}: assignedRoles differs from its last recorded value" in caught.stderr
