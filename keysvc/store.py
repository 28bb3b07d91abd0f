"""All SQL, as plain text with ``?`` parameters, behind a thin async store.

Two connections: one writer, guarded by a lock so that each write runs in its
own ``BEGIN IMMEDIATE`` transaction, and one reader, which in WAL mode sees
only committed data. The store returns dataclasses, never cursors, and knows
nothing of HTTP beyond raising keysvc's own errors.
"""

import asyncio
import json
import sqlite3
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import aiosqlite

from keysvc import db
from keysvc.config import ConfigError
from keysvc.errors import BadRequest, Conflict
from keysvc.timeutil import from_text, to_text


@dataclass(frozen=True)
class Role:
    id: str
    name: str
    type: str
    permissions: tuple[str, ...]


@dataclass(frozen=True)
class Organization:
    id: str
    name: str
    created_at: datetime


@dataclass(frozen=True)
class Key:
    id: str
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
    role_names: Sequence[str] = ()
    role_ids: Sequence[str] = ()


_KEY_BY_ID = """
    select id, organization_id, name, state, key_suffix, created_at, expire_at, used_at,
           ip_access_list
    from api_keys where id = ?
"""
_KEY_IN_ORG = """
    select id, organization_id, name, state, key_suffix, created_at, expire_at, used_at,
           ip_access_list
    from api_keys where id = ? and organization_id = ?
"""
_CREDENTIAL = """
    select id, organization_id, name, state, key_suffix, created_at, expire_at, used_at,
           ip_access_list, secret_hash
    from api_keys where key_id_hash = ?
"""


class Store:
    def __init__(self, writer: aiosqlite.Connection, reader: aiosqlite.Connection):
        self._writer = writer
        self._reader = reader
        self._write_lock = asyncio.Lock()

    @classmethod
    async def open(cls, path: Path) -> "Store":
        writer = await db.connect(path)
        try:
            await db.migrate(writer)
            reader = await db.connect(path)
        except BaseException:
            await writer.close()
            raise
        return cls(writer, reader)

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

    async def has_organization(self) -> bool:
        return await _one(self._reader, "select 1 from organizations limit 1", ()) is not None

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

    async def create_key(self, new: NewKey) -> Key:
        async with self._transaction() as conn:
            return await _insert_key(conn, new)

    async def get_key(self, organization_id: str, key_id: str) -> Key | None:
        row = await _one(self._reader, _KEY_IN_ORG, (key_id, organization_id))
        return None if row is None else await _key_from_row(self._reader, row)

    async def find_credential(self, key_id_hash: bytes) -> Credential | None:
        row = await _one(self._reader, _CREDENTIAL, (key_id_hash,))
        if row is None:
            return None
        return Credential(
            key=await _key_from_row(self._reader, row), secret_hash=row["secret_hash"]
        )

    async def touch_used(self, key_id: str, minute: datetime) -> None:
        """Set usedAt to ``minute`` unless it is already there (at most one write a minute)."""
        text = to_text(minute)
        async with self._transaction() as conn:
            await conn.execute(
                "update api_keys set used_at = ? where id = ? and (used_at is null or used_at < ?)",
                (text, key_id, text),
            )


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
    )


async def _roles_of(conn: aiosqlite.Connection, key_id: str) -> tuple[Role, ...]:
    rows = await _all(
        conn,
        "select r.id, r.name, r.type, r.permissions from key_roles kr"
        " join roles r on r.id = kr.role_id"
        " where kr.key_id = ? order by r.type = 'custom', r.name",
        (key_id,),
    )
    return tuple(_role(row) for row in rows)


async def _key_from_row(conn: aiosqlite.Connection, row: sqlite3.Row) -> Key:
    return Key(
        id=row["id"],
        organization_id=row["organization_id"],
        name=row["name"],
        state=row["state"],
        key_suffix=row["key_suffix"],
        created_at=from_text(row["created_at"]),
        expire_at=from_text(row["expire_at"]) if row["expire_at"] else None,
        used_at=from_text(row["used_at"]) if row["used_at"] else None,
        ip_access_list=json.loads(row["ip_access_list"]),
        roles=await _roles_of(conn, row["id"]),
    )


async def _resolve_roles(
    conn: aiosqlite.Connection, organization_id: str, names: Sequence[str], ids: Sequence[str]
) -> list[str]:
    """The role IDs for legacy names and role UUIDs, checked against the organization."""
    resolved: list[str] = []
    if names:
        rows = await _all(
            conn,
            "select id from roles where organization_id is null"
            " and name in (select value from json_each(?))",
            (json.dumps(list(names)),),
        )
        resolved.extend(row["id"] for row in rows)
    if ids:
        rows = await _all(
            conn,
            "select id from roles where id in (select value from json_each(?))"
            " and (organization_id is null or organization_id = ?)",
            (json.dumps(list(ids)), organization_id),
        )
        found = {row["id"] for row in rows}
        missing = [role_id for role_id in ids if role_id not in found]
        if missing:
            raise BadRequest(f"assignedRoleIds: no role {missing[0]} in this organization")
        resolved.extend(ids)
    return list(dict.fromkeys(resolved))


async def _insert_key(conn: aiosqlite.Connection, new: NewKey) -> Key:
    role_ids = await _resolve_roles(conn, new.organization_id, new.role_names, new.role_ids)
    if not role_ids:
        raise BadRequest("roles: a key needs at least one role: give roles or assignedRoleIds")
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
    await conn.executemany(
        "insert into key_roles (key_id, role_id) values (?, ?)",
        [(key_id, role_id) for role_id in role_ids],
    )
    row = await _one(conn, _KEY_BY_ID, (key_id,))
    assert row is not None
    return await _key_from_row(conn, row)
