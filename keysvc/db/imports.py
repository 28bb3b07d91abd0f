"""All SQL of imports and exports (issue 37): a batch of keys inserted whole, a few
statements a table however many keys it holds (``executemany``, which SQLite runs in
one call and asyncpg sends as one pipeline), the importIds already used, and the
organization's keys read in pages by their place (keyset paging, never an offset), so
that an export of a million keys holds one page at a time.

Functions here run on the connection they are given, inside the caller's transaction
(``keysvc.domain.imports`` owns it and its rules), and return plain values.
"""

import json
from collections.abc import Sequence
from typing import Any

from keysvc.db import keys as key_sql
from keysvc.db.contract import Connection
from keysvc.db.dialect import with_json_list
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
COUNTS = "select key_count, last_key_seq from organizations where id = ?"
INSERT_IMPORT = """
    insert into key_imports (organization_id, import_id, key_id, imported_at) values (?, ?, ?, ?)
"""
# A page of an organization's keys after a place, for the export (``export_page``).
EXPORT_PAGE = key_sql.KEY_PAGE


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


async def insert_batch(
    conn: Connection,
    key_rows: Sequence[tuple[object, ...]],
    role_rows: Sequence[tuple[object, ...]],
    detail_rows: Sequence[tuple[object, ...]],
    import_rows: Sequence[tuple[object, ...]],
) -> None:
    """The batch's keys, their roles, details and importIds: one statement a table."""
    for sql, rows in (
        (key_sql.INSERT_KEY, key_rows),
        (key_sql.INSERT_KEY_ROLE, role_rows),
        (key_sql.INSERT_DETAILS, detail_rows),
        (INSERT_IMPORT, import_rows),
    ):
        if rows:
            await conn.executemany(sql, rows)


async def export_page(conn: Connection, organization_id: str, after: int, limit: int) -> list[Any]:
    """Up to ``limit`` of the organization's keys after the place ``after``, with their
    roles: (the rows, the roles of those keys' rows)."""
    rows = await fetch_all(conn, EXPORT_PAGE, (organization_id, after, limit))
    if not rows:
        return []
    ids = json.dumps([row["id"] for row in rows])
    roles = await fetch_all(conn, key_sql.ROLES_OF_KEYS, (ids,))
    return [rows, roles]
