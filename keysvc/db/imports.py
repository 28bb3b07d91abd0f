"""All SQL of imports and exports (issue 37): a batch of keys inserted whole, a few
statements a table however many keys it holds (``executemany``, which SQLite runs in
one call and asyncpg sends as one pipeline), the importIds already used, and the
keys that already answer to a batch's material.

Functions here run on the connection they are given, inside the caller's transaction
(``keysvc.domain.imports`` owns it and its rules), and return plain values.
"""

import json
from collections.abc import Sequence

from keysvc.db import keys as key_sql
from keysvc.db.contract import Connection
from keysvc.db.dialect import Sql, with_json_list
from keysvc.db.rows import role_from_row
from keysvc.db.statements import fetch_all, fetch_one
from keysvc.models import Role

# The importIds of ``organization_id`` among a JSON list: those already imported.
TAKEN_IMPORT_IDS = with_json_list("""
    select import_id from key_imports where organization_id = ? and import_id in {json_list}
""")
# Those of a list of lookup hashes that some key's current or previous key ID has: such
# a record would take another key's credentials. Two index seeks each; the list is
# ``?`` placeholders (``_placeholders``), as many as the chunk's hashes.
_TAKEN_KEY_ID_HASHES = """
    select key_id_hash from api_keys where key_id_hash in ({marks})
    union
    select previous_key_id_hash from api_keys where previous_key_id_hash in ({marks})
"""
HASHES_PER_STATEMENT = 500
# SQLite's page cache while a batch is inserted: a key's row goes into six indexes of
# random values (its UUID, key-ID and secret hashes), and with SQLite's default 2 MB
# (keysvc sets none) most of a large organization's indexes are read again for each
# batch. Put back after (``narrow_cache``). PostgreSQL's buffers are the server's.
WIDE_CACHE = Sql("pragma cache_size = -131072", "select 0")
NARROW_CACHE = Sql("pragma cache_size = -2000", "select 0")
# The operator's import (``keysvc import``, its own process and connection): the
# write-ahead log copied into the database file every 65,536 pages (256 MiB) rather
# than SQLite's 1,000, so that the index pages a batch writes again after the last
# (a hash index's pages, written all over) are copied once per checkpoint, not once a
# batch. Commits are as durable as before (synchronous as set); the log is copied
# whole when the database's last connection closes, or at a server's next write to
# it. Not on a server's connection, whose readers would search a longer log.
LONG_WAL = Sql("pragma wal_autocheckpoint = 65536", "select 0")
COUNTS = "select key_count, last_key_seq from organizations where id = ?"
INSERT_IMPORT = """
    insert into key_imports (organization_id, import_id, key_id, imported_at) values (?, ?, ?, ?)
"""


async def taken_import_ids(conn: Connection, organization_id: str, ids: Sequence[str]) -> set[str]:
    if not ids:
        return set()
    rows = await fetch_all(conn, TAKEN_IMPORT_IDS, (organization_id, json.dumps(list(ids))))
    return {row[0] for row in rows}


def _placeholders(count: int) -> str:
    """``?, ?, ...``: only placeholders are built, never values."""
    return ", ".join("?" * count)


async def taken_key_id_hashes(conn: Connection, hashes: Sequence[bytes]) -> set[bytes]:
    """Those of ``hashes`` that some key answers to already, as its key ID or as the one
    a rotation replaced."""
    taken: set[bytes] = set()
    for start in range(0, len(hashes), HASHES_PER_STATEMENT):
        chunk = list(hashes[start : start + HASHES_PER_STATEMENT])
        sql = _TAKEN_KEY_ID_HASHES.format(marks=_placeholders(len(chunk)))
        taken.update(bytes(row[0]) for row in await fetch_all(conn, sql, chunk + chunk))
    return taken


async def roles_now(conn: Connection, role_ids: Sequence[str]) -> dict[str, Role]:
    """The roles of ``role_ids`` as they are inside the transaction, by ID: a role
    deleted since the records were checked is not among them."""
    if not role_ids:
        return {}
    rows = await fetch_all(conn, key_sql.GRANTED_ROLES, (json.dumps(list(role_ids)),))
    return {role.id: role for role in map(role_from_row, rows)}


async def counts(conn: Connection, organization_id: str) -> tuple[int, int]:
    """The organization's key count and the last place given to one of its keys."""
    row = await fetch_one(conn, COUNTS, (organization_id,))
    return (0, 0) if row is None else (int(row[0]), int(row[1]))


async def widen_cache(conn: Connection) -> None:
    await conn.execute(WIDE_CACHE)


async def lengthen_wal(conn: Connection) -> None:
    await conn.execute(LONG_WAL)


async def narrow_cache(conn: Connection) -> None:
    await conn.execute(NARROW_CACHE)


# SQLite's per-row triggers on a batch's inserts, and what each does, whitespace aside.
# Fired once a row, the first two cost as much as a row's own insert (an update each);
# a batch drops them in its transaction and does their work in one statement each
# (``BULK_COUNTED``, ``BULK_GRANTED``), then makes them again from their own text, so
# that no other connection ever sees the database without them. The third is the
# previous-key-ID check that ``taken_key_id_hashes`` makes for the whole batch in the
# same transaction. A trigger whose text is not this one (a later schema's) leaves
# the batch to the triggers. PostgreSQL's are left as they are (the query finds none).
_BULK_TRIGGERS = {
    "api_keys_counted": "after insert on api_keys begin update organizations set "
    "key_count = key_count + 1, last_key_seq = max(last_key_seq, new.org_seq) "
    "where id = new.organization_id; end",
    "key_roles_granted": "after insert on key_roles begin update meta set value = "
    "cast(value as integer) + 1 where name = 'auth_generation'; end",
    "api_keys_key_id_not_previous": "before insert on api_keys when exists (select 1 from "
    "api_keys where previous_key_id_hash = new.key_id_hash) begin select raise(abort, "
    "'api_keys.key_id_hash: another key''s previous key ID'); end",
}
BULK_TRIGGERS = Sql(
    "select name, sql from sqlite_schema where type = 'trigger' and name in "
    "('api_keys_counted', 'key_roles_granted', 'api_keys_key_id_not_previous')",
    "select null, null where false",
)
BULK_COUNTED = """
    update organizations set key_count = key_count + ?, last_key_seq = max(last_key_seq, ?)
    where id = ?
"""
BULK_GRANTED = "update meta set value = cast(value as integer) + ? where name = 'auth_generation'"


def _as_expected(name: str, sql: str) -> bool:
    words = " ".join(sql.split())
    return words == f"CREATE TRIGGER {name} {_BULK_TRIGGERS[name]}"


async def _drop_row_triggers(conn: Connection) -> list[str]:
    """SQLite: the row triggers of ``_BULK_TRIGGERS`` dropped, their texts returned to
    make them again; none (nothing dropped) on PostgreSQL, or if any is not as
    expected."""
    found = await fetch_all(conn, BULK_TRIGGERS, ())
    if len(found) != len(_BULK_TRIGGERS) or not all(_as_expected(n, sql) for n, sql in found):
        return []
    for name in _BULK_TRIGGERS:  # the constant names only: no SQL is built from values
        await conn.execute(f"drop trigger {name}")
    return [sql for _, sql in found]


async def insert_batch(
    conn: Connection,
    organization_id: str,
    last_seq: int,
    key_rows: Sequence[tuple[object, ...]],
    role_rows: Sequence[tuple[object, ...]],
    detail_rows: Sequence[tuple[object, ...]],
    import_rows: Sequence[tuple[object, ...]],
) -> None:
    """The batch's keys (all of ``organization_id``, whose places end at ``last_seq``),
    their roles, details and importIds: one statement a table, the row triggers' work
    one statement each."""
    triggers = await _drop_row_triggers(conn)
    for sql, rows in (
        (key_sql.INSERT_KEY, key_rows),
        (key_sql.INSERT_KEY_ROLE, role_rows),
        (key_sql.INSERT_DETAILS, detail_rows),
        (INSERT_IMPORT, import_rows),
    ):
        if rows:
            await conn.executemany(sql, rows)
    if triggers:
        await conn.execute(BULK_COUNTED, (len(key_rows), last_seq, organization_id))
        await conn.execute(BULK_GRANTED, (len(role_rows),))
        for sql in triggers:
            await conn.execute(sql)
