"""``keysvc audit verify`` on real database files: an intact log passes with one line,
and an edited, removed or truncated record, or a forged head, fails naming it."""

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from keysvc.db.sqlite.migrations import MIGRATIONS
from tests.helpers import write_sql as sql
from tests.rewind import UNDO_WEBHOOK_BINDING
from tests.server import bootstrap, keysvc


def made(tmp_path: Path) -> tuple[Path, list[str]]:
    """A database whose organization has four activities (bootstrap, three
    admin-keys), and their IDs in chain order."""
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    for _ in range(3):
        done = keysvc("admin-key", "--db", str(db))
        assert done.returncode == 0, done.stderr
    with sqlite3.connect(db) as conn:
        ids = [row[0] for row in conn.execute("select id from activities order by org_seq")]
    return db, ids


def test_an_intact_log_passes_with_a_summary(tmp_path: Path) -> None:
    db, _ = made(tmp_path)
    done = keysvc("audit", "verify", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "audit log intact: 4 activities in 1 organizations\n"
    with sqlite3.connect(db) as conn:
        actors = {row for row in conn.execute("select actor_type, actor_details from activities")}
    assert actors == {("system", "keysvc bootstrap"), ("system", "keysvc admin-key")}


def _edit(db: Path, ids: list[str]) -> None:
    sql(db, "update activities set after = ? where id = ?", json.dumps({"name": "x"}), ids[1])


def _remove_middle(db: Path, ids: list[str]) -> None:
    sql(db, "delete from activities where id = ?", ids[1])


def _remove_last(db: Path, ids: list[str]) -> None:
    sql(db, "delete from activities where id = ?", ids[-1])


def _truncate_and_move_head(db: Path, ids: list[str]) -> None:
    """The last record removed and the head set back to the one before, as far as the
    database alone allows: its MAC cannot be made without the pepper."""
    sql(db, "delete from activities where id = ?", ids[-1])
    sql(db, "update activity_heads set count = 3, last_hash ="
        " (select hash from activities where id = ?)", ids[-2])  # fmt: skip


def _remove_everything(db: Path, ids: list[str]) -> None:
    sql(db, "delete from activities")
    sql(db, "delete from activity_heads")


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        (_edit, "{ids[1]} (organization {org}, record 2): its content does not match"),
        (_remove_middle, "{ids[2]} (organization {org}, record 3): expected record 2"),
        (_remove_last, "organization {org}: the chain ends at record 3 but its head says 4"),
        (_truncate_and_move_head, "organization {org}: its chain head was edited"),
        (_remove_everything, "organization {org}: its chain has no head"),
    ],
)
def test_tampering_is_caught_and_named(
    tmp_path: Path, tamper: Callable[[Path, list[str]], None], named: str
) -> None:
    db, ids = made(tmp_path)
    with sqlite3.connect(db) as conn:
        (org,) = conn.execute("select id from organizations").fetchone()
    tamper(db, ids)
    done = keysvc("audit", "verify", "--db", str(db))
    assert done.returncode == 1, done.stderr
    assert named.format(ids=ids, org=org) in done.stderr
    assert done.stdout == ""


def test_it_needs_the_pepper(tmp_path: Path) -> None:
    db, _ = made(tmp_path)
    wrong = keysvc("audit", "verify", "--db", str(db), env={"KEYSVC_PEPPER": "p" * 64})
    assert wrong.returncode == 2 and "pepper does not match" in wrong.stderr
    (tmp_path / "keysvc.db.pepper").unlink()
    missing = keysvc("audit", "verify", "--db", str(db))
    assert missing.returncode == 2 and "pepper file" in missing.stderr


def test_a_database_from_before_the_log_is_upgraded_and_its_organizations_sealed(
    tmp_path: Path,
) -> None:
    """The migration step adds the log to a database that had none: at the next start
    its organization's chain begins with a create record of each key it holds, and
    what is written from then on verifies."""
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    with sqlite3.connect(db) as conn:
        (version,) = conn.execute("pragma user_version").fetchone()
    # The version before the log's step: the steps after it make their tables only if
    # they are missing, so running them again changes nothing.
    log_steps = [n for n, step in enumerate(MIGRATIONS) if "exists activities (" in step]
    before = log_steps[0] + 1
    assert before < version
    conn = sqlite3.connect(db)
    conn.executescript(
        f"drop table activities; drop table activity_heads; {UNDO_WEBHOOK_BINDING}"
        f" pragma user_version = {before};"
    )
    conn.close()
    old = keysvc("audit", "verify", "--db", str(db))
    assert old.returncode == 2 and "schema is older" in old.stderr
    done = keysvc("admin-key", "--db", str(db))
    assert done.returncode == 0, done.stderr
    verified = keysvc("audit", "verify", "--db", str(db))
    assert verified.returncode == 0, verified.stderr
    # The seal records the key that existed before the log, then admin-key its own.
    assert verified.stdout == "audit log intact: 2 activities in 1 organizations\n"
    with sqlite3.connect(db) as conn:
        actors = [row[0] for row in conn.execute("select actor_details from activities")]
    assert actors == ["existed before the activity log", "keysvc admin-key"]
