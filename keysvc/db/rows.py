"""Rows to records: ``Role`` and ``Key`` dataclasses from ``sqlite3.Row``s.

Records made from rows are kept by the rows' values: a row read again unchanged
gives back the object made before (with the JSON text keysvc.http.render keeps on it) rather
than a new one. A list page read again after one key's usedAt moved rebuilds
only that key. Records are immutable, so sharing them is safe; each table is
emptied whole when full.
"""

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TypeVar

from keysvc.models import Credits, Key, Refill, Role
from keysvc.nesting import stored_meta
from keysvc.timeutil import from_text

_T = TypeVar("_T")

ROLE_COLUMNS = ("id", "name", "type", "permissions", "created_at", "updated_at")
KEY_COLUMNS = (
    "seq", "org_seq", "id", "organization_id", "name", "state", "key_suffix", "created_at",
    "expire_at", "used_at", "ip_access_list", "rate_limit", "rate_window", "previous_until",
    "external_id", "meta", "credits_remaining", "credits_refill_interval",
    "credits_refill_amount", "credits_refill_day", "credits_next_refill", "credits_base",
    "credits_flags", "ratelimits",
)  # fmt: skip
MADE_MAX = 4096
_roles_made: dict[tuple[object, ...], Role] = {}
_keys_made: dict[tuple[object, ...], Key] = {}


def _made(
    table: dict[tuple[object, ...], _T], values: tuple[object, ...], make: Callable[[], _T]
) -> _T:
    """The record made before from ``values``, else ``make()``'s, kept in ``table``."""
    made = table.get(values)
    if made is None:
        made = make()
        if len(table) >= MADE_MAX:
            table.clear()
        table[values] = made
    return made


def role_from_row(row: sqlite3.Row, columns: Sequence[str] = ROLE_COLUMNS) -> Role:
    """The role in ``row``, whose columns are named ``columns`` (ROLE_COLUMNS's order)."""
    values = tuple(row[name] for name in columns)
    return _made(_roles_made, values, lambda: _role(*values))


def _role(
    id: object, name: object, type: object, permissions: object, created: object, updated: object
) -> Role:
    return Role(
        id=str(id),
        name=str(name),
        type=str(type),
        permissions=tuple(json.loads(str(permissions))),
        created_at=from_text(str(created)),
        updated_at=from_text(str(updated)),
    )


def key_from_row(row: sqlite3.Row, roles: Sequence[Role]) -> Key:
    return _made(
        _keys_made,
        (*(row[name] for name in KEY_COLUMNS), *roles),  # Role: frozen, hashable
        lambda: Key(
            id=row["id"],
            seq=row["seq"],
            org_seq=row["org_seq"],
            organization_id=row["organization_id"],
            name=row["name"],
            state=row["state"],
            key_suffix=row["key_suffix"],
            created_at=from_text(row["created_at"]),
            expire_at=from_text(row["expire_at"]) if row["expire_at"] else None,
            used_at=from_text(row["used_at"]) if row["used_at"] else None,
            ip_access_list=json.loads(row["ip_access_list"]),
            roles=tuple(roles),
            rate_limit=(row["rate_limit"], row["rate_window"]) if row["rate_limit"] else None,
            previous_until=from_text(row["previous_until"]) if row["previous_until"] else None,
            external_id=row["external_id"],
            meta=stored_meta(row["meta"]),
            credits=credits_from_row(row),
            ratelimits=row["ratelimits"],
        ),
    )


# credits_flags holds the credit events sent (keysvc.models.LOW_SENT, EXHAUSTED_SENT) in
# its low bits and the credits' revision above them: one column, no schema change.
_EVENT_BITS = 8


def credits_flags(credits: Credits) -> int:
    """The credits_flags column's value for ``credits``: its flags and its revision."""
    return credits.flags | credits.revision << _EVENT_BITS


def credits_from_row(row: sqlite3.Row) -> Credits | None:
    """The credits in a key's row; None when unlimited."""
    if row["credits_remaining"] is None:
        return None
    refill = None
    if row["credits_refill_interval"] is not None:
        refill = Refill(
            row["credits_refill_interval"],
            int(row["credits_refill_amount"]),
            int(row["credits_refill_day"] or 1),
        )
    due = row["credits_next_refill"]
    stored = int(row["credits_flags"] or 0)
    return Credits(
        int(row["credits_remaining"]),
        refill,
        from_text(due) if due else None,
        int(row["credits_base"] or 0),
        stored & ((1 << _EVENT_BITS) - 1),
        stored >> _EVENT_BITS,
    )


# A key row joined with its roles' (keysvc.db.keys.CREDENTIAL_JOINED): the role's
# columns carry this prefix, and are null for a key holding no role.
JOINED_ROLE_COLUMNS = tuple(f"role_{name}" for name in ROLE_COLUMNS)


def key_from_joined(rows: Sequence[sqlite3.Row]) -> Key | None:
    """The one key in ``rows``, one row per role it holds; None for no rows."""
    if not rows:
        return None
    roles = [role_from_row(row, JOINED_ROLE_COLUMNS) for row in rows if row["role_id"]]
    return key_from_row(rows[0], roles)


def keys_with_roles(rows: Sequence[sqlite3.Row], role_rows: Sequence[sqlite3.Row]) -> list[Key]:
    """Keys from their rows, and their roles from rows of (key_id, role columns...)."""
    roles: dict[str, list[Role]] = {row["id"]: [] for row in rows}
    for role_row in role_rows:
        roles[role_row["key_id"]].append(role_from_row(role_row))
    return [key_from_row(row, roles[row["id"]]) for row in rows]
