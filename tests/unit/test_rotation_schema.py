"""The rotation's schema step: a database upgraded from the first release and a new one
get the same previous-credential columns, unique index and triggers."""

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from keysvc.db.sqlite.store import Store

SCHEMA_V1 = Path(__file__).parents[1] / "data" / "schema_v1.sql"
ORG = "11111111-1111-4111-8111-111111111111"
KEY = "22222222-2222-4222-8222-222222222222"
GENERATION = "select cast(value as integer) from meta where name = 'auth_generation'"
# Each previous-credential column, changed by hand as an operator would.
HAND_EDITS = (
    "update api_keys set previous_key_id_hash = x'0a' where id = ?",
    "update api_keys set previous_secret_hash = x'0b' where id = ?",
    "update api_keys set previous_until = '2030-01-01T00:00:00Z' where id = ?",
)


def _upgraded(path: Path) -> None:
    raw = sqlite3.connect(path)
    raw.executescript(SCHEMA_V1.read_text())
    raw.execute("pragma user_version = 1")
    raw.execute("insert into organizations values (?, 'old', '2026-01-01T00:00:00Z')", (ORG,))
    raw.commit()
    raw.close()


def _new(path: Path) -> None:
    sqlite3.connect(path).close()


@pytest.mark.parametrize("made", [_upgraded, _new], ids=["upgraded", "new"])
async def test_previous_credentials_are_stored_indexed_and_watched(
    tmp_path: Path, made: Callable[[Path], None]
) -> None:
    path = tmp_path / "k.db"
    made(path)
    store = await Store.open(path)
    await store.close()
    raw = sqlite3.connect(path)
    try:
        columns = [row[1] for row in raw.execute("pragma table_info(api_keys)")]
        assert columns[-3:] == ["previous_key_id_hash", "previous_secret_hash", "previous_until"]
        indexes = {row[1]: row[2] for row in raw.execute("pragma index_list(api_keys)")}
        assert indexes["api_keys_previous_key_id"] == 1  # unique
        raw.execute("insert or ignore into organizations (id, name, created_at)"
                    " values (?, 'o', '2026-01-01T00:00:00Z')", (ORG,))  # fmt: skip
        raw.execute(
            "insert into api_keys (id, organization_id, name, state, key_id_hash, secret_hash,"
            " key_suffix, created_at, org_seq) values (?, ?, 'k', 'enabled', x'01', x'02',"
            " 'abcd', '2026-01-01T00:00:00Z', 1)",
            (KEY, ORG),
        )
        raw.commit()
        for edit in HAND_EDITS:
            (before,) = raw.execute(GENERATION).fetchone()
            raw.execute(edit, (KEY,))
            raw.commit()
            assert raw.execute(GENERATION).fetchone() == (before + 1,), edit
        # A previous key ID is some key's only: two keys cannot both keep the same one.
        raw.execute(
            "insert into api_keys (id, organization_id, name, state, key_id_hash, secret_hash,"
            " key_suffix, created_at, org_seq) values ('other', ?, 'k2', 'enabled', x'03',"
            " x'04', 'efgh', '2026-01-01T00:00:00Z', 2)",
            (ORG,),
        )
        with pytest.raises(sqlite3.IntegrityError):
            raw.execute("update api_keys set previous_key_id_hash = x'0a' where id = 'other'")
        # Nor may a new key take one as its own key ID.
        with pytest.raises(sqlite3.IntegrityError, match="key_id_hash"):
            raw.execute(
                "insert into api_keys (id, organization_id, name, state, key_id_hash,"
                " secret_hash, key_suffix, created_at, org_seq) values ('third', ?, 'k3',"
                " 'enabled', x'0a', x'05', 'ijkl', '2026-01-01T00:00:00Z', 3)",
                (ORG,),
            )
    finally:
        raw.close()
