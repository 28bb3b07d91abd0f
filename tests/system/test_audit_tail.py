"""``keysvc audit verify`` against a log whose end was cut with a saved head: the
records written since a head was saved are removed and that head is put back. The
chain then holds, so the live tables must give it away."""

import sqlite3
from pathlib import Path

from tests.server import bootstrap, keysvc


def test_a_log_cut_back_to_a_saved_head_is_caught(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    assert keysvc("admin-key", "--db", str(db)).returncode == 0
    with sqlite3.connect(db) as conn:
        saved = conn.execute(
            "select organization_id, count, last_hash, mac from activity_heads"
        ).fetchone()
        before = {row[0] for row in conn.execute("select id from api_keys")}
    hidden = keysvc("admin-key", "--db", str(db))  # the write to hide: a new admin key
    assert hidden.returncode == 0, hidden.stderr
    conn = sqlite3.connect(db)
    try:
        with conn:
            conn.execute("delete from activities where org_seq > ?", (saved[1],))
            conn.execute(
                "update activity_heads set count = ?, last_hash = ?, mac = ?"
                " where organization_id = ?",
                (saved[1], saved[2], saved[3], saved[0]),
            )
        (new_key,) = {row[0] for row in conn.execute("select id from api_keys")} - before
    finally:
        conn.close()
    done = keysvc("audit", "verify", "--db", str(db))
    assert done.returncode == 1, done.stdout
    assert f"key {new_key} has no key_create record in its organization" in done.stderr
    assert done.stdout == ""
