"""All SQL, as plain text with ``?`` parameters, behind a thin async store.

Two connections: one writer, guarded by a lock so that each write runs in its
own ``BEGIN IMMEDIATE`` transaction, and one reader, which in WAL mode sees
only committed data. The store returns dataclasses, never cursors, and knows
nothing of HTTP beyond raising keysvc's own errors. Lists of IDs are passed
as one JSON parameter and expanded with ``json_each``, so no SQL is ever built.
"""

import asyncio
import functools
import hashlib
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import aiosqlite

from keysvc import db
from keysvc.config import ConfigError
from keysvc.errors import BadRequest, Conflict, PreconditionFailed
from keysvc.timeutil import from_text, to_text


@dataclass(frozen=True)
class Role:
    id: str
    name: str
    type: str
    permissions: tuple[str, ...]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class RoleDetail:
    """A role as seen from one organization, with the keys that hold it there."""

    role: Role
    organization_id: str
    actors: tuple[str, ...]


@dataclass(frozen=True)
class Organization:
    id: str
    name: str
    created_at: datetime


@dataclass(frozen=True)
class Key:
    id: str
    seq: int
    organization_id: str
    name: str
    state: str
    key_suffix: str
    created_at: datetime
    expire_at: datetime | None
    used_at: datetime | None
    ip_access_list: list[dict[str, str]]
    roles: tuple[Role, ...]

    @property
    def permissions(self) -> frozenset[str]:
        return frozenset(p for role in self.roles for p in role.permissions)

    @property
    def etag(self) -> str:
        """A strong ETag of what a PATCH can change (usedAt moves on its own)."""
        state = [
            self.name,
            self.state,
            to_text(self.expire_at) if self.expire_at else None,
            self.ip_access_list,
            [(role.id, role.name) for role in self.roles],
        ]
        digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
        return f'"{digest[:20]}"'


@dataclass(frozen=True)
class Credential:
    """What authentication needs: the key, and the keyed hash of its secret."""

    key: Key
    secret_hash: bytes = field(repr=False)


@dataclass(frozen=True)
class NewKey:
    organization_id: str
    name: str
    state: str
    key_id_hash: bytes = field(repr=False)
    secret_hash: bytes = field(repr=False)
    key_suffix: str
    created_at: datetime
    expire_at: datetime | None = None
    ip_access_list: list[dict[str, str]] = field(default_factory=list)
    role_ids: Sequence[str] = ()


@dataclass(frozen=True)
class KeyChange:
    """A PATCH, already validated: None means "leave as it is"."""

    name: str | None = None
    state: str | None = None
    expire_at: datetime | None = None
    clear_expiry: bool = False
    ip_access_list: list[dict[str, str]] | None = None
    role_ids: Sequence[str] | None = None


@dataclass(frozen=True)
class KeyPage:
    keys: list[Key]
    more: bool
    total: int


_KEY_BY_ID = """
    select seq, id, organization_id, name, state, key_suffix, created_at, expire_at, used_at,
           ip_access_list
    from api_keys where id = ? and organization_id = ?
"""
_KEY_PAGE = """
    select seq, id, organization_id, name, state, key_suffix, created_at, expire_at, used_at,
           ip_access_list
    from api_keys where organization_id = ? and seq > ? order by seq limit ?
"""
_CREDENTIAL = """
    select seq, id, organization_id, name, state, key_suffix, created_at, expire_at, used_at,
           ip_access_list, secret_hash
    from api_keys where key_id_hash = ?
"""
_ROLES_OF_KEYS = """
    select kr.key_id, r.id, r.name, r.type, r.permissions, r.created_at, r.updated_at
    from key_roles kr join roles r on r.id = kr.role_id
    where kr.key_id in (select value from json_each(?))
    order by r.type = 'custom', r.name
"""
# A role is visible in an organization if it is a system role or that organization's own.
_ROLES_IN_ORG = """
    select id, name, type, permissions, created_at, updated_at from roles
    where (organization_id is null or organization_id = ?)
    order by type = 'custom', name
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
_SYSTEM_ROLES_NAMED = """
    select id, name, type, permissions, created_at, updated_at from roles
    where organization_id is null and name in (select value from json_each(?))
"""
_COUNT_KEYS = "select count(*) from api_keys where organization_id = ?"
# The effective state, as authentication sees it: expired means enabled but past expireAt.
# julianday compares the instants, whatever fraction of a second the text carries.
_COUNT_KEYS_BY_STATE = """
    select case
               when state = 'disabled' then 'disabled'
               when expire_at is not null and julianday(expire_at) <= julianday(?) then 'expired'
               else 'enabled'
           end as effective,
           count(*) as n
    from api_keys group by effective
"""

# Told the name and duration in seconds of every store call, for metrics.
Observer = Callable[[str, float], None]
_P = ParamSpec("_P")
_T = TypeVar("_T")


def _timed(
    method: Callable[Concatenate["Store", _P], Awaitable[_T]],
) -> Callable[Concatenate["Store", _P], Awaitable[_T]]:
    """Report the call's duration, waiting for the write lock included, to the observer."""
    name = method.__name__

    @functools.wraps(method)
    async def timed(self: "Store", /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        observer = self._observer
        if observer is None:
            return await method(self, *args, **kwargs)
        started = time.perf_counter()
        try:
            return await method(self, *args, **kwargs)
        finally:
            observer(name, time.perf_counter() - started)

    return timed


class Store:
    def __init__(
        self,
        writer: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        observer: Observer | None = None,
    ):
        self._writer = writer
        self._reader = reader
        self._write_lock = asyncio.Lock()
        self._observer = observer

    @classmethod
    async def open(cls, path: Path, *, observer: Observer | None = None) -> "Store":
        writer = await db.connect(path)
        try:
            await db.migrate(writer)
            reader = await db.connect(path)
        except BaseException:
            await writer.close()
            raise
        return cls(writer, reader, observer)

    async def close(self) -> None:
        await self._reader.close()
        await self._writer.close()

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        async with self._write_lock:
            await self._writer.execute("begin immediate")
            try:
                yield self._writer
            except BaseException:
                await self._writer.execute("rollback")
                raise
            await self._writer.execute("commit")

    @_timed
    async def check_pepper(self, fingerprint: str) -> None:
        """Record the pepper's fingerprint on first start; refuse a different pepper later."""
        async with self._transaction() as conn:
            row = await _one(conn, "select value from meta where name = 'pepper'", ())
            if row is None:
                await conn.execute(
                    "insert into meta (name, value) values ('pepper', ?)", (fingerprint,)
                )
            elif row["value"] != fingerprint:
                raise ConfigError(
                    "the pepper does not match this database: restore the pepper file "
                    "or KEYSVC_PEPPER that was used with it"
                )

    @_timed
    async def schema_is_current(self) -> bool:
        """True when the database answers and its schema is the one this code expects."""
        row = await _one(self._reader, "pragma user_version", ())
        return row is not None and row[0] == db.schema_version()

    @_timed
    async def has_organization(self) -> bool:
        return await _one(self._reader, "select 1 from organizations limit 1", ()) is not None

    @_timed
    async def bootstrap(self, org_name: str, new: NewKey) -> tuple[Organization, Key]:
        """Create an organization and its first key in one transaction."""
        org = Organization(id=str(uuid.uuid4()), name=org_name, created_at=new.created_at)
        async with self._transaction() as conn:
            await conn.execute(
                "insert into organizations (id, name, created_at) values (?, ?, ?)",
                (org.id, org.name, to_text(org.created_at)),
            )
            key = await _insert_key(conn, replace(new, organization_id=org.id))
        return org, key

    # Keys

    @_timed
    async def create_key(self, new: NewKey, max_keys: int) -> Key:
        async with self._transaction() as conn:
            count = await _one(conn, _COUNT_KEYS, (new.organization_id,))
            if count is not None and count[0] >= max_keys:
                raise Conflict(f"this organization has reached its limit of {max_keys} keys")
            return await _insert_key(conn, new)

    @_timed
    async def get_key(self, organization_id: str, key_id: str) -> Key | None:
        return await _get_key(self._reader, organization_id, key_id)

    @_timed
    async def list_keys(self, organization_id: str, after_seq: int, limit: int) -> KeyPage:
        """Keys oldest first, after ``after_seq``: a keyset page, as cheap at page N as page 1."""
        rows = await _all(self._reader, _KEY_PAGE, (organization_id, after_seq, limit + 1))
        keys = await _keys_from_rows(self._reader, rows[:limit])
        total = await _one(self._reader, _COUNT_KEYS, (organization_id,))
        return KeyPage(keys=keys, more=len(rows) > limit, total=total[0] if total else 0)

    @_timed
    async def update_key(
        self,
        organization_id: str,
        key_id: str,
        change: KeyChange,
        if_match: Collection[str] | None = None,
    ) -> Key | None:
        """Apply ``change``; with ``if_match``, only if the key's ETag is among them."""
        async with self._transaction() as conn:
            current = await _get_key(conn, organization_id, key_id)
            if current is None:
                return None
            if if_match is not None and "*" not in if_match and current.etag not in if_match:
                raise PreconditionFailed()
            expire_at = None if change.clear_expiry else change.expire_at or current.expire_at
            await conn.execute(
                "update api_keys set name = ?, state = ?, expire_at = ?, ip_access_list = ?"
                " where id = ?",
                (
                    change.name or current.name,
                    change.state or current.state,
                    to_text(expire_at) if expire_at else None,
                    json.dumps(
                        current.ip_access_list
                        if change.ip_access_list is None
                        else change.ip_access_list
                    ),
                    key_id,
                ),
            )
            if change.role_ids is not None:
                await conn.execute("delete from key_roles where key_id = ?", (key_id,))
                await _insert_key_roles(conn, key_id, change.role_ids)
            return await _get_key(conn, organization_id, key_id)

    @_timed
    async def delete_key(self, organization_id: str, key_id: str) -> bool:
        async with self._transaction() as conn:
            cursor = await conn.execute(
                "delete from api_keys where id = ? and organization_id = ?",
                (key_id, organization_id),
            )
            return cursor.rowcount > 0

    @_timed
    async def find_credential(self, key_id_hash: bytes) -> Credential | None:
        row = await _one(self._reader, _CREDENTIAL, (key_id_hash,))
        if row is None:
            return None
        (key,) = await _keys_from_rows(self._reader, [row])
        return Credential(key=key, secret_hash=row["secret_hash"])

    @_timed
    async def touch_used(self, key_id: str, minute: datetime) -> None:
        """Set usedAt to ``minute`` unless it is already there (at most one write a minute)."""
        text = to_text(minute)
        async with self._transaction() as conn:
            await conn.execute(
                "update api_keys set used_at = ? where id = ? and (used_at is null or used_at < ?)",
                (text, key_id, text),
            )

    @_timed
    async def count_keys_by_state(self, now: datetime) -> dict[str, int]:
        """Keys of all organizations by effective state: enabled, disabled, expired."""
        counts = {"enabled": 0, "disabled": 0, "expired": 0}
        for row in await _all(self._reader, _COUNT_KEYS_BY_STATE, (to_text(now),)):
            counts[row["effective"]] = row["n"]
        return counts

    # Roles

    @_timed
    async def resolve_roles(
        self, organization_id: str, names: Sequence[str], ids: Sequence[str]
    ) -> list[Role]:
        """The roles for legacy system-role names and role UUIDs of this organization."""
        by_name = await _all(self._reader, _SYSTEM_ROLES_NAMED, (json.dumps(list(names)),))
        by_id = await _all(
            self._reader, _ROLES_WITH_IDS_IN_ORG, (organization_id, json.dumps(list(ids)))
        )
        found = {row["id"] for row in by_id}
        missing = [role_id for role_id in ids if role_id not in found]
        if missing:
            raise BadRequest(f"assignedRoleIds: no role {missing[0]} in this organization")
        roles = {row["id"]: _role(row) for row in [*by_name, *by_id]}
        return list(roles.values())

    @_timed
    async def list_roles(self, organization_id: str) -> list[RoleDetail]:
        rows = await _all(self._reader, _ROLES_IN_ORG, (organization_id,))
        return [await _role_detail(self._reader, organization_id, row) for row in rows]

    @_timed
    async def get_role(self, organization_id: str, role_id: str) -> RoleDetail | None:
        return await _get_role(self._reader, organization_id, role_id)

    @_timed
    async def create_role(
        self,
        organization_id: str,
        name: str,
        permissions: Sequence[str],
        actors: Sequence[str],
        now: datetime,
    ) -> RoleDetail:
        role_id = str(uuid.uuid4())
        async with self._transaction() as conn:
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
            detail = await _get_role(conn, organization_id, role_id)
        assert detail is not None
        return detail

    @_timed
    async def update_role(
        self,
        organization_id: str,
        role_id: str,
        now: datetime,
        name: str | None = None,
        permissions: Sequence[str] | None = None,
        actors: Sequence[str] | None = None,
    ) -> RoleDetail | None:
        """Change a custom role of this organization; None if there is no such role."""
        async with self._transaction() as conn:
            current = await _get_role(conn, organization_id, role_id)
            if current is None or current.role.type != "custom":
                return None
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
            return await _get_role(conn, organization_id, role_id)

    @_timed
    async def delete_role(self, organization_id: str, role_id: str) -> bool:
        """Delete a custom role that no key holds; False if there is no such role."""
        async with self._transaction() as conn:
            exists = await _one(
                conn,
                "select 1 from roles where id = ? and organization_id = ?",
                (role_id, organization_id),
            )
            if exists is None:
                return False
            holders = await _one(
                conn, "select count(*) from key_roles where role_id = ?", (role_id,)
            )
            if holders is not None and holders[0]:
                raise Conflict(f"role is assigned to {holders[0]} key(s); unassign it first")
            await conn.execute("delete from roles where id = ?", (role_id,))
            return True


async def _one(
    conn: aiosqlite.Connection, sql: str, params: Sequence[object]
) -> sqlite3.Row | None:
    async with conn.execute(sql, params) as cursor:
        row: sqlite3.Row | None = await cursor.fetchone()
    return row


async def _all(conn: aiosqlite.Connection, sql: str, params: Sequence[object]) -> list[sqlite3.Row]:
    async with conn.execute(sql, params) as cursor:
        return list(await cursor.fetchall())


def _role(row: sqlite3.Row) -> Role:
    return Role(
        id=row["id"],
        name=row["name"],
        type=row["type"],
        permissions=tuple(json.loads(row["permissions"])),
        created_at=from_text(row["created_at"]),
        updated_at=from_text(row["updated_at"]),
    )


async def _keys_from_rows(conn: aiosqlite.Connection, rows: Sequence[sqlite3.Row]) -> list[Key]:
    """Keys with their roles, read with one query for the whole batch."""
    roles: dict[str, list[Role]] = {row["id"]: [] for row in rows}
    if rows:
        for role_row in await _all(conn, _ROLES_OF_KEYS, (json.dumps(list(roles)),)):
            roles[role_row["key_id"]].append(_role(role_row))
    return [
        Key(
            id=row["id"],
            seq=row["seq"],
            organization_id=row["organization_id"],
            name=row["name"],
            state=row["state"],
            key_suffix=row["key_suffix"],
            created_at=from_text(row["created_at"]),
            expire_at=from_text(row["expire_at"]) if row["expire_at"] else None,
            used_at=from_text(row["used_at"]) if row["used_at"] else None,
            ip_access_list=json.loads(row["ip_access_list"]),
            roles=tuple(roles[row["id"]]),
        )
        for row in rows
    ]


async def _get_key(conn: aiosqlite.Connection, organization_id: str, key_id: str) -> Key | None:
    row = await _one(conn, _KEY_BY_ID, (key_id, organization_id))
    return None if row is None else (await _keys_from_rows(conn, [row]))[0]


async def _insert_key_roles(
    conn: aiosqlite.Connection, key_id: str, role_ids: Sequence[str]
) -> None:
    try:
        await conn.executemany(
            "insert into key_roles (key_id, role_id) values (?, ?)",
            [(key_id, role_id) for role_id in dict.fromkeys(role_ids)],
        )
    except sqlite3.IntegrityError:
        raise Conflict("a role was deleted while this request ran; try again") from None


async def _insert_key(conn: aiosqlite.Connection, new: NewKey) -> Key:
    key_id = str(uuid.uuid4())
    try:
        await conn.execute(
            "insert into api_keys (id, organization_id, name, state, key_id_hash, secret_hash,"
            " key_suffix, ip_access_list, created_at, expire_at)"
            " values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key_id,
                new.organization_id,
                new.name,
                new.state,
                new.key_id_hash,
                new.secret_hash,
                new.key_suffix,
                json.dumps(new.ip_access_list),
                to_text(new.created_at),
                to_text(new.expire_at) if new.expire_at else None,
            ),
        )
    except sqlite3.IntegrityError as exc:
        if "key_id_hash" in str(exc):
            raise Conflict("hashData.keyIdHash: a key with this key ID already exists") from None
        raise
    await _insert_key_roles(conn, key_id, new.role_ids)
    key = await _get_key(conn, new.organization_id, key_id)
    assert key is not None
    return key


async def _role_detail(
    conn: aiosqlite.Connection, organization_id: str, row: sqlite3.Row
) -> RoleDetail:
    actors = await _all(
        conn,
        "select k.id from key_roles kr join api_keys k on k.id = kr.key_id"
        " where kr.role_id = ? and k.organization_id = ? order by k.seq",
        (row["id"], organization_id),
    )
    return RoleDetail(_role(row), organization_id, tuple(a["id"] for a in actors))


async def _get_role(
    conn: aiosqlite.Connection, organization_id: str, role_id: str
) -> RoleDetail | None:
    row = await _one(conn, _ROLE_IN_ORG, (organization_id, role_id))
    return None if row is None else await _role_detail(conn, organization_id, row)


async def _check_role_name(conn: aiosqlite.Connection, organization_id: str, name: str) -> None:
    taken = await _one(conn, _ROLE_NAMED_IN_ORG, (organization_id, name))
    if taken is not None:
        raise Conflict(f"name: a role named {name!r} already exists in this organization")


async def _set_actors(
    conn: aiosqlite.Connection, organization_id: str, role_id: str, key_ids: Sequence[str]
) -> None:
    """Make exactly ``key_ids`` hold the role; no key may be left without a role."""
    wanted = list(dict.fromkeys(key_ids))
    found = await _all(
        conn,
        "select id from api_keys where organization_id = ?"
        " and id in (select value from json_each(?))",
        (organization_id, json.dumps(wanted)),
    )
    missing = set(wanted) - {row["id"] for row in found}
    if missing:
        raise BadRequest(f"actors: no key {sorted(missing)[0]} in this organization")
    stranded = await _one(
        conn,
        "select kr.key_id from key_roles kr where kr.role_id = ?"
        " and kr.key_id not in (select value from json_each(?))"
        " and not exists (select 1 from key_roles other"
        "                 where other.key_id = kr.key_id and other.role_id != kr.role_id)",
        (role_id, json.dumps(wanted)),
    )
    if stranded is not None:
        raise Conflict(f"actors: key {stranded['key_id']} would be left with no role")
    await conn.execute(
        "delete from key_roles where role_id = ?"
        " and key_id not in (select value from json_each(?))",
        (role_id, json.dumps(wanted)),
    )
    await conn.executemany(
        "insert or ignore into key_roles (key_id, role_id) values (?, ?)",
        [(key_id, role_id) for key_id in wanted],
    )
