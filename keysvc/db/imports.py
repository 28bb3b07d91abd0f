"""All SQL of imports and exports (issue 37): a batch of keys inserted whole, a few
statements a table however many keys it holds (``executemany``, which SQLite runs in
one call and asyncpg sends as one pipeline), the importIds already used, and the
keys that already answer to a batch's material.

Functions here run on the connection they are given, inside the caller's transaction
(``keysvc.domain.imports`` owns it and its rules), and return plain values.
"""

import contextlib
import json
import sqlite3
from collections.abc import Iterator, Sequence

from keysvc.db import keys as key_sql
from keysvc.db.contract import Connection
from keysvc.db.dialect import Sql, with_json_list
from keysvc.db.rows import role_from_row
from keysvc.db.statements import fetch_all, fetch_one, many_row_statements
from keysvc.models import Role

# The importIds of ``organization_id`` among a JSON list: those already imported.
TAKEN_IMPORT_IDS = with_json_list("""
    select import_id from key_imports where organization_id = ? and import_id in {json_list}
""")
# Those of a list of lookup hashes that a key's previous key ID has (a rotation's),
# and those that some key's current or previous key ID has: such a record would take
# another key's credentials. One or two index seeks each; the list is ``?``
# placeholders (``_placeholders``), as many as the chunk's hashes.
_TAKEN_PREVIOUS_HASHES = """
    select previous_key_id_hash from api_keys where previous_key_id_hash in ({marks})
"""
_TAKEN_KEY_ID_HASHES = (
    "select key_id_hash from api_keys where key_id_hash in ({marks}) union"  # noqa: S608 - constants
    + _TAKEN_PREVIOUS_HASHES
)
HASHES_PER_STATEMENT = 5000
# The previous key IDs keys still answer to, all of them when there are at most
# PREVIOUS_READ (a rotation's until its grace period ends: few), checked in Python;
# past it, the batch's hashes are looked up in their index (``_TAKEN_PREVIOUS_HASHES``).
PREVIOUS_KEY_ID_HASHES = """
    select previous_key_id_hash from api_keys where previous_key_id_hash is not null limit ?
"""
PREVIOUS_READ = 4096


class KeyIdTaken(Exception):
    """A batch's key ID is one another key has already (its unique index refused the
    batch's insert, ``insert_batch``): the transaction is to be rolled back, nothing of
    it written."""


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
    return await _taken(conn, _TAKEN_KEY_ID_HASHES, 2, hashes)


async def taken_previous_hashes(conn: Connection, hashes: Sequence[bytes]) -> set[bytes]:
    """Those of ``hashes`` that some key answers to as the key ID a rotation replaced:
    the half of ``taken_key_id_hashes`` that no index refuses at insert (the other, a
    current key ID's, ``insert_batch`` refuses with ``KeyIdTaken``)."""
    rows = await fetch_all(conn, PREVIOUS_KEY_ID_HASHES, (PREVIOUS_READ + 1,))
    if len(rows) > PREVIOUS_READ:
        return await _taken(conn, _TAKEN_PREVIOUS_HASHES, 1, hashes)
    previous = {bytes(row[0]) for row in rows}
    return {h for h in hashes if h in previous}


async def _taken(conn: Connection, sql: str, lists: int, hashes: Sequence[bytes]) -> set[bytes]:
    """The hashes ``sql`` finds among ``hashes``, asked HASHES_PER_STATEMENT at a time
    (``sql`` holds ``lists`` lists of them)."""
    taken: set[bytes] = set()
    for start in range(0, len(hashes), HASHES_PER_STATEMENT):
        chunk = list(hashes[start : start + HASHES_PER_STATEMENT])
        statement = sql.format(marks=_placeholders(len(chunk)))
        taken.update(bytes(row[0]) for row in await fetch_all(conn, statement, chunk * lists))
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


# SQLite's per-row triggers on a batch's inserts stand aside while the batch's
# transaction holds meta's 'bulk_insert' row (schema.sql: their ``when`` reads it), and
# what each does, whitespace aside. The first two cost as much as a row's own insert
# (an update each); the batch does their work in one statement each
# (``BULK_COUNTED``, ``BULK_GRANTED``). The third is the previous-key-ID check that
# ``taken_key_id_hashes`` makes for the whole batch in the same transaction. The row is
# added at the batch's start and deleted before its commit, so no other connection
# ever sees it, and the schema never changes (nor its version: no other connection
# prepares its statements again). A trigger whose text is not this one (a later
# schema's, an operator's) leaves the batch to the triggers, and PostgreSQL's fire for
# each row (the query finds none there).
_BULK_TRIGGERS = {
    "api_keys_counted": "after insert on api_keys when not exists (select 1 from meta where "
    "name = 'bulk_insert') begin update organizations set key_count = key_count + 1, "
    "last_key_seq = max(last_key_seq, new.org_seq) where id = new.organization_id; end",
    "key_roles_granted": "after insert on key_roles when not exists (select 1 from meta where "
    "name = 'bulk_insert') begin update meta set value = cast(value as integer) + 1 where "
    "name = 'auth_generation'; end",
    "api_keys_key_id_not_previous": "before insert on api_keys when not exists (select 1 from "
    "meta where name = 'bulk_insert') and exists (select 1 from api_keys where "
    "previous_key_id_hash = new.key_id_hash) begin select raise(abort, "
    "'api_keys.key_id_hash: another key''s previous key ID'); end",
}
BULK_TRIGGERS = Sql(
    "select name, sql from sqlite_schema where type = 'trigger' and name in "
    "('api_keys_counted', 'key_roles_granted', 'api_keys_key_id_not_previous')",
    "select null, null where false",
)
BULK_BEGIN = "insert into meta (name, value) values ('bulk_insert', '1')"
BULK_END = "delete from meta where name = 'bulk_insert'"
BULK_COUNTED = Sql(
    """update organizations set key_count = key_count + ?, last_key_seq = max(last_key_seq, ?)
       where id = ?""",
    """update organizations set key_count = key_count + ?, last_key_seq = greatest(last_key_seq, ?)
       where id = ?""",
)
BULK_GRANTED = Sql(
    "update meta set value = cast(value as integer) + ? where name = 'auth_generation'",
    "update meta set value = (value::bigint + ?)::text where name = 'auth_generation'",
)
# PostgreSQL: the batch's key and role rows leave their organization's count and the
# generation to ``BULK_COUNTED`` and ``BULK_GRANTED`` (the ``api_keys_counted`` and
# ``key_roles_granted`` triggers read ``keysvc.bulk_insert`` and ``keysvc.new_key``, the
# latter as create_key sets it). Row by row, each updated one row again (the
# organization's, meta's generation) under the write lock every instance's writes take,
# each update longer than the last: 1,000 keys of 30 roles held it for 11 to 24 s and
# failed, and so did `keysvc import`'s 10,000-key batches (rt41 R4, R5). On SQLite (a
# trigger not as expected, so none stands aside: each fires) no-ops.
NEW_KEYS_ON = Sql(
    "select 0",
    "select set_config('keysvc.new_key', 'on', true), set_config('keysvc.bulk_insert', 'on', true)",
)
NEW_KEYS_OFF = Sql(
    "select 0",
    "select set_config('keysvc.new_key', '', true), set_config('keysvc.bulk_insert', '', true)",
)
NEW_KEYS_COUNTED = Sql("select ?, ?, ?", BULK_COUNTED.postgres)
NEW_KEYS_GRANTED = Sql("select ?", BULK_GRANTED.postgres)

# SQLite: a table that has triggers (even ones that stand aside) makes each insert into
# it keep a statement journal, a copy of every page it changes, spilled to a temporary
# file past 64 KiB. Row by row (``executemany``) that is a copy of a key's pages for
# every key; so the batch's key and role rows are first put in two of the connection's
# own temporary tables, which have no trigger, then moved in one ``insert ... select``
# each, whose journal copies each page once. The temporary tables are made once a
# connection (``temp``: its own schema, which no other connection sees) and emptied
# after each batch; ``temp_store = memory`` keeps them and the statement journals off
# the disk (set before the temporary database is first opened, as SQLite requires in
# a transaction).
STAGING = (
    "pragma temp_store = memory",
    f"create temp table if not exists import_keys as"  # noqa: S608 - constant column names
    f" select {key_sql.KEY_COLUMNS} from main.api_keys where false",
    """create temp table if not exists import_roles as
       select key_id, role_id from main.key_roles where false""",
)
# Each table's rows go in many to a statement (``_insert_many``), not one a call of
# ``executemany``: the connection's thread takes the GIL once a statement to bind its
# parameters, where ``executemany`` takes it again for every row, and waits for it
# each time another thread holds it (the loop's, ``keysvc import``'s reading and
# taking threads): 200,000 rows into a temporary table took 0.6 s alone, 2.3 s beside
# a thread running Python.
STAGE_KEYS = f"insert into temp.import_keys ({key_sql.KEY_COLUMNS}) values "  # noqa: S608 - constants
STAGE_KEY_ROLES = "insert into temp.import_roles (key_id, role_id) values "
INSERT_DETAILS_MANY = key_sql.INSERT_DETAILS[: key_sql.INSERT_DETAILS.index("values")] + "values "
INSERT_IMPORTS_MANY = INSERT_IMPORT[: INSERT_IMPORT.index("values")] + "values "
# The parameters of one statement, at most (SQLite takes up to 32,766).
PARAMETERS_PER_STATEMENT = 30_000
# In the staged order: the keys' rowids (their seq) follow the records'.
STAGED = (
    f"insert into api_keys ({key_sql.KEY_COLUMNS})"  # noqa: S608 - constant column names
    " select * from temp.import_keys order by rowid",
    "insert into key_roles (key_id, role_id) select * from temp.import_roles order by rowid",
    "delete from temp.import_keys",
    "delete from temp.import_roles",
)


async def _insert_many(conn: Connection, into: str, rows: Sequence[tuple[object, ...]]) -> None:
    """``into`` (``insert into t (columns) values``) for ``rows``, as many a statement as
    PARAMETERS_PER_STATEMENT allows. Only the placeholders are built: the values are
    parameters, as everywhere."""
    if not rows:
        return
    for sql, values in many_row_statements(into, rows, PARAMETERS_PER_STATEMENT // len(rows[0])):
        await conn.execute(sql, values)


@contextlib.contextmanager
def _key_id_taken() -> Iterator[None]:
    """A key ID's unique index (or, on PostgreSQL, the trigger that guards previous key
    IDs) refusing a batch's keys, as ``KeyIdTaken``."""
    try:
        yield
    except sqlite3.IntegrityError as exc:  # PostgreSQL's refusals too (IntegrityRefusal)
        if "key_id_hash" in str(exc):
            raise KeyIdTaken from None
        raise


def _as_expected(name: str, sql: str) -> bool:
    words = " ".join(sql.split())
    return words == f"CREATE TRIGGER {name} {_BULK_TRIGGERS[name]}"


async def _stand_aside(conn: Connection) -> bool:
    """SQLite: the row triggers of ``_BULK_TRIGGERS`` stood aside for the rest of the
    transaction, if each is as expected; False (nothing done) otherwise, and on
    PostgreSQL."""
    found = await fetch_all(conn, BULK_TRIGGERS, ())
    if len(found) != len(_BULK_TRIGGERS) or not all(_as_expected(n, sql) for n, sql in found):
        return False
    await conn.execute(BULK_BEGIN)
    return True


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
    their roles, details and importIds: a few statements a table, the row triggers'
    work one statement each. ``KeyIdTaken`` if a key's key ID is another's already."""
    bulk = await _stand_aside(conn)
    if bulk:
        for sql in STAGING:
            await conn.execute(sql)
        await _insert_many(conn, STAGE_KEYS, key_rows)
        await _insert_many(conn, STAGE_KEY_ROLES, role_rows)
        with _key_id_taken():
            await conn.execute(STAGED[0])  # the keys
        for sql in STAGED[1:]:
            await conn.execute(sql)
        await _insert_many(conn, INSERT_DETAILS_MANY, detail_rows)
        await _insert_many(conn, INSERT_IMPORTS_MANY, import_rows)
    else:
        await conn.execute(NEW_KEYS_ON)
        with _key_id_taken():
            await conn.executemany(key_sql.INSERT_KEY, key_rows)
        if role_rows:
            await conn.executemany(key_sql.INSERT_KEY_ROLE, role_rows)
        await conn.execute(NEW_KEYS_OFF)
        await conn.execute(NEW_KEYS_COUNTED, (len(key_rows), last_seq, organization_id))
        await conn.execute(NEW_KEYS_GRANTED, (len(role_rows),))
        for sql, rows in ((key_sql.INSERT_DETAILS, detail_rows), (INSERT_IMPORT, import_rows)):
            if rows:
                await conn.executemany(sql, rows)
    if bulk:
        await conn.execute(BULK_COUNTED, (len(key_rows), last_seq, organization_id))
        await conn.execute(BULK_GRANTED, (len(role_rows),))
        await conn.execute(BULK_END)
