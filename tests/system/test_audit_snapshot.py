"""``keysvc audit verify`` while keysvc writes: it reads one snapshot, so a write
committed between its reads (here, deterministically, right after it reads the
heads) cannot make an intact log look truncated."""

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from keysvc.credentials import ACTIVITY_CHAIN, Hasher, load_pepper
from keysvc.db.activities import Chain, verify
from tests.server import bootstrap, keysvc


class WriteAfterHeads:
    """A read-only connection to the database on which, right after the first read of
    the chain heads, another process commits a write (``keysvc admin-key``), as it
    can while keysvc serves."""

    def __init__(self, db: Path):
        self.conn = sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True)
        self.db = db
        self.written = False

    def execute(self, sql: str, *params: Any) -> Iterator[Any]:
        rows = self.conn.execute(sql, *params).fetchall()
        if "from activity_heads" in sql and not self.written:
            self.written = True
            done = keysvc("admin-key", "--db", str(self.db))
            assert done.returncode == 0, done.stderr
        return iter(rows)


def test_a_write_between_verifys_reads_is_not_taken_for_tampering(tmp_path: Path) -> None:
    db = tmp_path / "keysvc.db"
    bootstrap(db)
    pepper = load_pepper(None, tmp_path / "keysvc.db.pepper", create=False)
    chain = Chain(Hasher(pepper).derive(ACTIVITY_CHAIN))
    racing = WriteAfterHeads(db)
    try:
        verdict = verify(racing, chain)  # type: ignore[arg-type]
    finally:
        racing.conn.close()
    assert racing.written
    assert (verdict.problem, verdict.records) == (None, 1)  # the snapshot before the write
    done = keysvc("audit", "verify", "--db", str(db))
    assert (done.returncode, done.stdout) == (
        0,
        "audit log intact: 2 activities in 1 organizations\n",
    )
