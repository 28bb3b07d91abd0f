"""All SQL about roles: system and custom roles, and which keys hold them.

It works through the Store's reader and writer (``keysvc.db.connections``); every write
that can change what a key may do bumps the authorization generation, so
cached credentials everywhere are dropped before the next request.
"""

import json
import sqlite3
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

import aiosqlite

from keysvc.db.connections import Writer, fetch_all, fetch_one
from keysvc.db.rows import role_from_row
from keysvc.db.timing import Observer, timed
from keysvc.errors import BadRequest, Conflict
from keysvc.models import Role, RoleDetail, RolePage
from keysvc.schemas import MAX_ROLE_IDS
from keysvc.timeutil import to_text

# The name sent is not repeated: an answer never echoes what the caller gave.
ROLE_NAME_TAKEN = "name: a role with this name already exists in this organization; choose another"

# A role is visible in an organization if it is a system role or that organization's own.
# A page of them: system roles first, then custom roles, each by name, after a position
# (is custom, name); names are unique among the roles an organization sees. The
# coalesce is the one roles_org_name indexes.
_ROLE_PAGE = """
    select id, name, type, permissions, created_at, updated_at from roles
    where coalesce(organization_id, '') in ('', ?) and (type = 'custom', name) > (?, ?)
    order by type = 'custom', name limit ?
"""
_COUNT_ROLES_IN_ORG = "select count(*) from roles where coalesce(organization_id, '') in ('', ?)"
_COUNT_CUSTOM_ROLES = "select count(*) from roles where coalesce(organization_id, '') = ?"
# The keys of the organization holding each of the given roles, oldest first.
_ACTORS_OF_ROLES = """
    select kr.role_id, k.id from key_roles kr join api_keys k on k.id = kr.key_id
    where kr.role_id in (select value from json_each(?)) and k.organization_id = ?
    order by k.seq
"""
# A key, of those given, that holds ``limit`` roles or more besides the given one.
_KEY_WITH_ROLES_BESIDES = """
    select key_id from key_roles
    where key_id in (select value from json_each(?)) and role_id != ?
    group by key_id having count(*) >= ? limit 1
"""
_ROLE_IN_ORG = """
    select id, name, type, permissions, created_at, updated_at from roles
    where (organization_id is null or organization_id = ?) and id = ?
"""
_ROLE_NAMED_IN_ORG = """
    select id from roles where (organization_id is null or organization_id = ?) and name = ?
"""
_ROLES_WITH_IDS_IN_ORG = """
    select id, name, type, permissions, created_at, updated_at from roles
    where (organization_id is null or organization_id = ?)
      and id in (select value from json_each(?))
"""
# Every permission that any of the given keys of the organization holds.
_PERMISSIONS_OF_KEYS = """
    select distinct p.value from api_keys k
    join key_roles kr on kr.key_id = k.id
    join roles r on r.id = kr.role_id, json_each(r.permissions) p
    where k.organization_id = ? and k.id in (select value from json_each(?))
"""
# Called inside a role's write transaction, before it writes, with: the role as it is
# then (None on create); the IDs of the keys that would gain or lose it; and every
# permission held by the keys whose permissions the write changes (those, and the
# role's holders when its permissions change). Refuses by raising.
RoleCheck = Callable[[RoleDetail | None, set[str], frozenset[str]], None]
_SYSTEM_ROLES_NAMED = """
    select id, name, type, permissions, created_at, updated_at from roles
    where organization_id is null and name in (select value from json_each(?))
"""


class RoleStore:
    def __init__(self, reader: aiosqlite.Connection, writer: Writer, observer: Observer | None):
        self._reader = reader
        self._writer = writer
        self.observer = observer
        # System roles by name, as read: they come with the schema and no request can
        # change or delete them (keysvc.roles), so a process reads each one once.
        self._system: dict[str, Role] = {}

    @timed
    async def resolve_roles(
        self, organization_id: str, names: Sequence[str], ids: Sequence[str]
    ) -> list[Role]:
        """The roles for legacy system-role names and role UUIDs of this organization."""
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
        found = {row["id"] for row in by_id}
        missing = [role_id for role_id in ids if role_id not in found]
        if missing:
            raise BadRequest(f"assignedRoleIds: no role {missing[0]} in this organization")
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
        return await _get_role(self._reader, organization_id, role_id)

    @timed
    async def create_role(
        self,
        organization_id: str,
        name: str,
        permissions: Sequence[str],
        actors: Sequence[str],
        now: datetime,
        check: RoleCheck | None = None,
        *,
        max_roles: int,
    ) -> RoleDetail:
        """A new custom role, unless the organization holds ``max_roles`` already."""
        role_id = str(uuid.uuid4())
        async with self._writer.transaction() as conn:
            if check is not None:
                moved = set(actors)
                check(None, moved, await _permissions_of_keys(conn, organization_id, moved))
            held = await fetch_one(conn, _COUNT_CUSTOM_ROLES, (organization_id,))
            if held is not None and held[0] >= max_roles:
                raise Conflict(
                    f"this organization has reached its limit of {max_roles} custom roles;"
                    " delete one it no longer needs"
                )
            await _check_role_name(conn, organization_id, name)
            await conn.execute(
                "insert into roles (id, organization_id, name, type, permissions, created_at,"
                " updated_at) values (?, ?, ?, 'custom', ?, ?, ?)",
                (
                    role_id,
                    organization_id,
                    name,
                    json.dumps(list(permissions)),
                    to_text(now),
                    to_text(now),
                ),
            )
            await _set_actors(conn, organization_id, role_id, actors)
            if actors:
                await self._writer.authorization_changed(conn)
            detail = await _get_role(conn, organization_id, role_id)
        assert detail is not None
        return detail

    @timed
    async def update_role(
        self,
        organization_id: str,
        role_id: str,
        now: datetime,
        name: str | None = None,
        permissions: Sequence[str] | None = None,
        actors: Sequence[str] | None = None,
        check: RoleCheck | None = None,
    ) -> RoleDetail | None:
        """Change a custom role of this organization; None if there is no such role."""
        async with self._writer.transaction() as conn:
            current = await _get_role(conn, organization_id, role_id)
            if current is None or current.role.type != "custom":
                return None
            if check is not None:
                moved = set() if actors is None else set(current.actors) ^ set(actors)
                affected = set(moved)
                if permissions is not None and set(permissions) != set(current.role.permissions):
                    affected.update(current.actors)
                check(current, moved, await _permissions_of_keys(conn, organization_id, affected))
            if name is not None and name != current.role.name:
                await _check_role_name(conn, organization_id, name)
            await conn.execute(
                "update roles set name = ?, permissions = ?, updated_at = ? where id = ?",
                (
                    name or current.role.name,
                    json.dumps(
                        list(current.role.permissions if permissions is None else permissions)
                    ),
                    to_text(now),
                    role_id,
                ),
            )
            if actors is not None:
                await _set_actors(conn, organization_id, role_id, actors)
            await self._writer.authorization_changed(conn)
            return await _get_role(conn, organization_id, role_id)

    @timed
    async def delete_role(
        self, organization_id: str, role_id: str, check: RoleCheck | None = None
    ) -> bool:
        """Delete a custom role that no key holds; False if there is no such role."""
        async with self._writer.transaction() as conn:
            current = await _get_role(conn, organization_id, role_id)
            if current is None or current.role.type != "custom":
                return False
            if check is not None:
                check(current, set(), frozenset())
            holders = await fetch_one(
                conn, "select count(*) from key_roles where role_id = ?", (role_id,)
            )
            if holders is not None and holders[0]:
                raise Conflict(f"role is assigned to {holders[0]} key(s); unassign it first")
            await conn.execute("delete from roles where id = ?", (role_id,))
            await self._writer.authorization_changed(conn)
        return True


async def _permissions_of_keys(
    conn: aiosqlite.Connection, organization_id: str, key_ids: set[str]
) -> frozenset[str]:
    if not key_ids:
        return frozenset()
    rows = await fetch_all(
        conn, _PERMISSIONS_OF_KEYS, (organization_id, json.dumps(sorted(key_ids)))
    )
    return frozenset(row[0] for row in rows)


async def _details(
    conn: aiosqlite.Connection, organization_id: str, rows: Sequence[sqlite3.Row]
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


async def _get_role(
    conn: aiosqlite.Connection, organization_id: str, role_id: str
) -> RoleDetail | None:
    row = await fetch_one(conn, _ROLE_IN_ORG, (organization_id, role_id))
    return None if row is None else (await _details(conn, organization_id, [row]))[0]


async def _check_role_name(conn: aiosqlite.Connection, organization_id: str, name: str) -> None:
    taken = await fetch_one(conn, _ROLE_NAMED_IN_ORG, (organization_id, name))
    if taken is not None:
        raise Conflict(ROLE_NAME_TAKEN)


async def _set_actors(
    conn: aiosqlite.Connection, organization_id: str, role_id: str, key_ids: Sequence[str]
) -> None:
    """Make exactly ``key_ids`` hold the role; no key may be left without a role, nor
    given more than MAX_ROLE_IDS, the most a create or PATCH of a key may give it."""
    wanted = list(dict.fromkeys(key_ids))
    found = await fetch_all(
        conn,
        "select id from api_keys where organization_id = ?"
        " and id in (select value from json_each(?))",
        (organization_id, json.dumps(wanted)),
    )
    missing = set(wanted) - {row["id"] for row in found}
    if missing:
        raise BadRequest(f"actors: no key {sorted(missing)[0]} in this organization")
    stranded = await fetch_one(
        conn,
        "select kr.key_id from key_roles kr where kr.role_id = ?"
        " and kr.key_id not in (select value from json_each(?))"
        " and not exists (select 1 from key_roles other"
        "                 where other.key_id = kr.key_id and other.role_id != kr.role_id)",
        (role_id, json.dumps(wanted)),
    )
    if stranded is not None:
        raise Conflict(f"actors: key {stranded['key_id']} would be left with no role")
    full = await fetch_one(
        conn, _KEY_WITH_ROLES_BESIDES, (json.dumps(wanted), role_id, MAX_ROLE_IDS)
    )
    if full is not None:
        raise Conflict(
            f"actors: key {full['key_id']} already holds {MAX_ROLE_IDS} roles, the most"
            " a key may hold; take one from it first"
        )
    await conn.execute(
        "delete from key_roles where role_id = ?"
        " and key_id not in (select value from json_each(?))",
        (role_id, json.dumps(wanted)),
    )
    await conn.executemany(
        "insert or ignore into key_roles (key_id, role_id) values (?, ?)",
        [(key_id, role_id) for key_id in wanted],
    )
