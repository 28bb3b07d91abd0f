"""All SQL about roles: system and custom roles, and which keys hold them.

``RoleStore`` reads through the Store's reader. The writes are functions run on the
connection of a transaction the domain holds (``keysvc.domain.roles``), which checks its
rules there between their reads and writes; they check nothing themselves.
"""

import json
import sqlite3
from collections.abc import Sequence

from keysvc.db.contract import Connection
from keysvc.db.dialect import Sql, with_json_list
from keysvc.db.rows import role_from_row
from keysvc.db.statements import fetch_all, fetch_one
from keysvc.db.timing import Observer, timed
from keysvc.models import Role, RoleDetail, RolePage
from keysvc.timeutil import to_text

# A role is visible in an organization if it is a system role or that organization's own.
# A page of them: system roles first, then custom roles, each by name, after a position
# (is custom, name); names are unique among the roles an organization sees. The
# coalesce is the one roles_org_name indexes. PostgreSQL compares the position's
# "is custom" (0 or 1) as a number.
_ROLE_PAGE = Sql(
    """
    select id, name, type, permissions, created_at, updated_at from roles
    where coalesce(organization_id, '') in ('', ?) and (type = 'custom', name) > (?, ?)
    order by type = 'custom', name limit ?
    """,
    """
    select id, name, type, permissions, created_at, updated_at from roles
    where coalesce(organization_id, '') in ('', ?)
      and ((type = 'custom')::int, name) > (?::int, ?::text)
    order by type = 'custom', name limit ?
    """,
)
_COUNT_ROLES_IN_ORG = "select count(*) from roles where coalesce(organization_id, '') in ('', ?)"
_COUNT_CUSTOM_ROLES = "select count(*) from roles where coalesce(organization_id, '') = ?"
# The keys of the organization holding each of the given roles, oldest first.
_ACTORS_OF_ROLES = with_json_list("""
    select kr.role_id, k.id from key_roles kr join api_keys k on k.id = kr.key_id
    where kr.role_id in {json_list} and k.organization_id = ?
    order by k.seq
""")
# A key, of those given, that holds ``limit`` roles or more besides the given one.
_KEY_WITH_ROLES_BESIDES = with_json_list("""
    select key_id from key_roles
    where key_id in {json_list} and role_id != ?
    group by key_id having count(*) >= ? limit 1
""")
_ROLE_IN_ORG = """
    select id, name, type, permissions, created_at, updated_at from roles
    where (organization_id is null or organization_id = ?) and id = ?
"""
_CUSTOM_ROLES_OF = """
    select id, name, type, permissions, created_at, updated_at from roles
    where organization_id = ? and type = 'custom' order by name
"""
_ROLE_NAMED_IN_ORG = """
    select id from roles where (organization_id is null or organization_id = ?) and name = ?
"""
_ROLES_WITH_IDS_IN_ORG = with_json_list("""
    select id, name, type, permissions, created_at, updated_at from roles
    where (organization_id is null or organization_id = ?)
      and id in {json_list}
""")
# Every permission that any of the given keys of the organization holds.
_PERMISSIONS_OF_KEYS = with_json_list(
    """
    select distinct p.value from api_keys k
    join key_roles kr on kr.key_id = k.id
    join roles r on r.id = kr.role_id, json_each(r.permissions) p
    where k.organization_id = ? and k.id in {json_list}
    """,
    """
    select distinct p.value from api_keys k
    join key_roles kr on kr.key_id = k.id
    join roles r on r.id = kr.role_id, jsonb_array_elements_text(r.permissions::jsonb) p
    where k.organization_id = ? and k.id in {json_list}
    """,
)
_SYSTEM_ROLES_NAMED = with_json_list("""
    select id, name, type, permissions, created_at, updated_at from roles
    where organization_id is null and name in {json_list}
""")

_KEYS_IN_ORG = with_json_list(
    "select id from api_keys where organization_id = ? and id in {json_list}"
)
# A key that holds the role and no other, and is not among the given ones.
_STRANDED = with_json_list("""
    select kr.key_id from key_roles kr where kr.role_id = ? and kr.key_id not in {json_list}
    and not exists (select 1 from key_roles other
                    where other.key_id = kr.key_id and other.role_id != kr.role_id)
""")
_DROP_ACTORS_BUT = with_json_list(
    "delete from key_roles where role_id = ? and key_id not in {json_list}"
)
_ADD_ACTOR = Sql(
    "insert or ignore into key_roles (key_id, role_id) values (?, ?)",
    "insert into key_roles (key_id, role_id) values (?, ?) on conflict do nothing",
)


class RoleStore:
    def __init__(self, reader: Connection, observer: Observer | None):
        self._reader = reader
        self.observer = observer
        # System roles by name, as read: they come with the schema and no request can
        # change or delete them (keysvc.domain.roles), so a process reads each one once.
        self._system: dict[str, Role] = {}

    @timed
    async def resolve_roles(
        self, organization_id: str, names: Sequence[str], ids: Sequence[str]
    ) -> list[Role]:
        """The roles for legacy system-role names and role UUIDs of this organization;
        a name or UUID that names none is left out."""
        reader = self._reader
        # A create names roles one way or the other, mostly: no query for the other.
        unread = [name for name in names if name not in self._system]
        if unread:
            for row in await fetch_all(reader, _SYSTEM_ROLES_NAMED, (json.dumps(unread),)):
                self._system[row["name"]] = role_from_row(row)
        by_name = [self._system[name] for name in dict.fromkeys(names) if name in self._system]
        by_id = (
            await fetch_all(
                reader, _ROLES_WITH_IDS_IN_ORG, (organization_id, json.dumps(list(ids)))
            )
            if ids
            else []
        )
        roles = {role.id: role for role in [*by_name, *(role_from_row(row) for row in by_id)]}
        return list(roles.values())

    @timed
    async def list_roles(
        self, organization_id: str, after: tuple[int, str], limit: int
    ) -> RolePage:
        """Up to ``limit`` roles after the position ``after`` (is custom, name); (-1, "")
        is the start. Three statements, whatever the page size."""
        reader = self._reader
        rows = await fetch_all(reader, _ROLE_PAGE, (organization_id, *after, limit + 1))
        roles = await _details(reader, organization_id, rows[:limit])
        total = await fetch_one(reader, _COUNT_ROLES_IN_ORG, (organization_id,))
        return RolePage(roles, more=len(rows) > limit, total=total[0] if total else 0)

    @timed
    async def get_role(self, organization_id: str, role_id: str) -> RoleDetail | None:
        return await get_role(self._reader, organization_id, role_id)


async def get_role(conn: Connection, organization_id: str, role_id: str) -> RoleDetail | None:
    """A role the organization sees, with the keys holding it; None if there is none."""
    row = await fetch_one(conn, _ROLE_IN_ORG, (organization_id, role_id))
    return None if row is None else (await _details(conn, organization_id, [row]))[0]


async def custom_roles(conn: Connection, organization_id: str) -> list[RoleDetail]:
    """Every custom role of the organization, with the keys holding each."""
    rows = await fetch_all(conn, _CUSTOM_ROLES_OF, (organization_id,))
    return await _details(conn, organization_id, rows)


async def _details(
    conn: Connection, organization_id: str, rows: Sequence[sqlite3.Row]
) -> list[RoleDetail]:
    """The roles of ``rows`` with the keys holding each, read in one statement."""
    if not rows:
        return []
    actors: dict[str, list[str]] = {row["id"]: [] for row in rows}
    held = await fetch_all(conn, _ACTORS_OF_ROLES, (json.dumps(list(actors)), organization_id))
    for role_id, key_id in held:
        actors[role_id].append(key_id)
    return [
        RoleDetail(role_from_row(row), organization_id, tuple(actors[row["id"]])) for row in rows
    ]


async def permissions_of_keys(
    conn: Connection, organization_id: str, key_ids: set[str]
) -> frozenset[str]:
    """Every permission that any of the given keys of the organization holds."""
    if not key_ids:
        return frozenset()
    rows = await fetch_all(
        conn, _PERMISSIONS_OF_KEYS, (organization_id, json.dumps(sorted(key_ids)))
    )
    return frozenset(row[0] for row in rows)


async def count_custom_roles(conn: Connection, organization_id: str) -> int:
    held = await fetch_one(conn, _COUNT_CUSTOM_ROLES, (organization_id,))
    return 0 if held is None else int(held[0])


async def name_taken(conn: Connection, organization_id: str, name: str) -> bool:
    """Whether a role the organization sees is called ``name``."""
    return await fetch_one(conn, _ROLE_NAMED_IN_ORG, (organization_id, name)) is not None


async def insert_role(conn: Connection, organization_id: str, role: Role) -> None:
    """Write a new custom role of the organization."""
    await conn.execute(
        "insert into roles (id, organization_id, name, type, permissions, created_at,"
        " updated_at) values (?, ?, ?, 'custom', ?, ?, ?)",
        (
            role.id,
            organization_id,
            role.name,
            json.dumps(list(role.permissions)),
            to_text(role.created_at),
            to_text(role.updated_at),
        ),
    )


async def update_role(conn: Connection, role: Role) -> None:
    """Write a role's name, permissions and updatedAt."""
    await conn.execute(
        "update roles set name = ?, permissions = ?, updated_at = ? where id = ?",
        (role.name, json.dumps(list(role.permissions)), to_text(role.updated_at), role.id),
    )


async def count_holders(conn: Connection, role_id: str) -> int:
    """How many keys hold the role."""
    holders = await fetch_one(conn, "select count(*) from key_roles where role_id = ?", (role_id,))
    return 0 if holders is None else int(holders[0])


async def delete_role(conn: Connection, role_id: str) -> None:
    await conn.execute("delete from roles where id = ?", (role_id,))


async def keys_in_organization(
    conn: Connection, organization_id: str, key_ids: Sequence[str]
) -> set[str]:
    """Those of ``key_ids`` that are keys of the organization."""
    found = await fetch_all(conn, _KEYS_IN_ORG, (organization_id, json.dumps(list(key_ids))))
    return {row["id"] for row in found}


async def stranded_key(conn: Connection, role_id: str, key_ids: Sequence[str]) -> str | None:
    """A key that holds the role and no other, and is not among ``key_ids``: one that
    making exactly ``key_ids`` hold the role would leave with no role."""
    stranded = await fetch_one(conn, _STRANDED, (role_id, json.dumps(list(key_ids))))
    return None if stranded is None else str(stranded["key_id"])


async def key_with_roles_besides(
    conn: Connection, key_ids: Sequence[str], role_id: str, limit: int
) -> str | None:
    """A key, of ``key_ids``, that holds ``limit`` roles or more besides ``role_id``."""
    full = await fetch_one(
        conn, _KEY_WITH_ROLES_BESIDES, (json.dumps(list(key_ids)), role_id, limit)
    )
    return None if full is None else str(full["key_id"])


async def set_actors(conn: Connection, role_id: str, key_ids: Sequence[str]) -> None:
    """Make exactly ``key_ids`` hold the role."""
    await conn.execute(_DROP_ACTORS_BUT, (role_id, json.dumps(list(key_ids))))
    await conn.executemany(_ADD_ACTOR, [(key_id, role_id) for key_id in key_ids])
