"""bench/seed.py: the keys seeded only to be read are there, never in the rotation, and
look like the used keys (a usedAt), so every key's JSON has one size; get-other reads
them as the admin key."""

import sqlite3
from pathlib import Path

from bench import scenarios, seed


def test_the_others_are_seeded_apart_from_the_rotation(tmp_path: Path) -> None:
    seeded = seed.seed(tmp_path / "keysvc.db", 3, rotate=3, others=2)
    assert len(seeded.sample) == 3 and len(seeded.others) == 2
    assert not {c.id for c in seeded.sample} & set(seeded.others)
    with sqlite3.connect(seeded.db) as conn:
        rows = dict(conn.execute("select id, used_at from api_keys").fetchall())
    assert len(rows) == 6  # the admin key too
    assert all(rows[uuid] for uuid in seeded.others)
    assert all(rows[c.id] is None for c in seeded.sample)  # the touch before measuring sets them
    lines = scenarios.BY_NAME["get-other"].lines(seeded)
    assert {line.authorization for line in lines} == {scenarios.basic(seeded.admin)}
    assert [line.path.rsplit("/", 1)[1] for line in lines] == seeded.others
