"""All SQL about identities (issue 36), as plain text with ``?`` parameters, the same on
both backends.

``IdentityStore`` reads through the store's reader, as ``keysvc.db.roles.RoleStore``
does; the writes are functions run on the connection of a transaction the domain
holds (``keysvc.domain.identities``), which checks its rules there; they check nothing
themselves. A key belongs to the identity of its organization whose ``external_id`` is
the key's: there is no column on the key, so a key's identity is found by that pair.
"""

import json
import sqlite3
from collections.abc import Sequence

from keysvc.db.cache import Caches, IdentityFacts
from keysvc.db.contract import Connection
from keysvc.db.keys import credits_params
from keysvc.db.roles import permissions_of_keys
from keysvc.db.rows import credits_flags, credits_from_row
from keysvc.db.statements import fetch_all, fetch_one
from keysvc.db.timing import Observer, timed
from keysvc.models import Identity, IdentityPage
from keysvc.timeutil import from_text, to_text

_IDENTITY = """
    select id, organization_id, org_seq, external_id, meta, ratelimits, credits_remaining,
           credits_refill_interval, credits_refill_amount, credits_refill_day,
           credits_next_refill, credits_base, credits_flags, created_at, updated_at
    from identities where organization_id = ?
"""
BY_ID = _IDENTITY + " and id = ?"
BY_EXTERNAL_ID = _IDENTITY + " and external_id = ?"
_PAGE = _IDENTITY + " and org_seq > ? order by org_seq limit ?"
_COUNT = "select count(*) from identities where organization_id = ?"
_NEXT_SEQ = "select coalesce(max(org_seq), 0) + 1 from identities where organization_id = ?"
_INSERT = """
    insert into identities (id, organization_id, org_seq, external_id, meta, ratelimits,
        credits_remaining, credits_refill_interval, credits_refill_amount, credits_refill_day,
        credits_next_refill, credits_base, credits_flags, created_at, updated_at)
    values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
_UPDATE = """
    update identities set meta = ?, ratelimits = ?, credits_remaining = ?,
        credits_refill_interval = ?, credits_refill_amount = ?, credits_refill_day = ?,
        credits_next_refill = ?, credits_base = ?, credits_flags = ?, updated_at = ?
    where id = ?
"""
_DELETE = "delete from identities where id = ?"
# The keys of an identity: those of its organization with its externalId, oldest first.
_KEYS_OF = """
    select api_keys.id from key_details join api_keys on api_keys.id = key_details.key_id
    where organization_id = ? and external_id = ? order by org_seq
"""


def identity_from_row(row: sqlite3.Row) -> Identity:
    meta = row["meta"]
    return Identity(
        id=row["id"],
        organization_id=row["organization_id"],
        org_seq=int(row["org_seq"]),
        external_id=row["external_id"],
        meta=None if meta is None else json.loads(meta),
        credits=credits_from_row(row),
        ratelimits=row["ratelimits"],
        created_at=from_text(row["created_at"]),
        updated_at=from_text(row["updated_at"]),
    )


def _one(rows: Sequence[sqlite3.Row]) -> Identity | None:
    return identity_from_row(rows[0]) if rows else None


# Not an identity's facts: ``None`` is one (the keys' externalId has no identity).
_NOT_CACHED = IdentityFacts("", has_credits=False, ratelimits=None)


def _sharing(facts: IdentityFacts | None) -> str | None:
    return facts.id if facts is not None and facts.has_credits else None


def _limits(facts: IdentityFacts | None) -> tuple[str | None, str | None]:
    if facts is None or not facts.ratelimits:
        return None, None
    return facts.id, facts.ratelimits


class IdentityStore:
    """The identities as read outside a transaction."""

    def __init__(self, reader: Connection, observer: Observer | None, caches: Caches):
        self._reader = reader
        self.observer = observer
        self._caches = caches

    async def sharing(self, organization_id: str, external_id: str) -> str | None:
        """The UUID of the identity whose credits a verify of a key with ``external_id``
        spends from; None when there is none or its credits are unlimited."""
        return _sharing(await self._facts(organization_id, external_id))

    def sharing_here(self, organization_id: str, external_id: str) -> tuple[bool, str | None]:
        """``sharing`` without an await when it is cached: (True, its answer); else
        (False, None), and ``sharing`` reads it."""
        known, facts = self._cached(organization_id, external_id)
        return known, _sharing(facts)

    async def limits(self, organization_id: str, external_id: str) -> tuple[str | None, str | None]:
        """The UUID and the named rate limits (stored form) of the identity of the keys
        with ``external_id``; (None, None) when it has none."""
        return _limits(await self._facts(organization_id, external_id))

    def limits_here(
        self, organization_id: str, external_id: str
    ) -> tuple[bool, tuple[str | None, str | None]]:
        """``limits`` without an await when it is cached: (True, its answer); else
        (False, (None, None)), and ``limits`` reads it."""
        known, facts = self._cached(organization_id, external_id)
        return known, _limits(facts)

    def _cached(self, organization_id: str, external_id: str) -> tuple[bool, IdentityFacts | None]:
        """Whether ``_facts`` is cached, and what it is (no statement, no await)."""
        caches, owner = self._caches, (organization_id, external_id)
        caches.data_version()
        facts = caches.identities.get(owner, _NOT_CACHED)
        if facts is _NOT_CACHED:
            return False, None
        return True, facts

    async def _facts(self, organization_id: str, external_id: str) -> IdentityFacts | None:
        """What a verify needs of the identity of the keys with ``external_id``. Cached
        until the authorization generation moves (any change to whether an identity
        has credits, or to its limits, moves it: ``keysvc.domain.identities``), so a
        warm verify runs no statement for it."""
        known, facts = self._cached(organization_id, external_id)
        if known:
            return facts
        caches = self._caches
        generation = caches.generation
        found = await identity_by_external_id(self._reader, organization_id, external_id)
        if found is not None:
            facts = IdentityFacts(found.id, found.credits is not None, found.ratelimits)
        if caches.unchanged_since(generation):
            caches.identities[(organization_id, external_id)] = facts
        return facts

    @timed
    async def get_identity(self, organization_id: str, identity_id: str) -> Identity | None:
        return await get_identity(self._reader, organization_id, identity_id)

    @timed
    async def list_identities(
        self, organization_id: str, after: int, limit: int, external_id: str | None = None
    ) -> IdentityPage:
        """Up to ``limit`` identities after the place ``after`` (``Identity.org_seq``),
        oldest first; only the one of ``external_id`` when given."""
        reader = self._reader
        if external_id is not None:
            found = await identity_by_external_id(reader, organization_id, external_id)
            page = [found] if found is not None and found.org_seq > after else []
            return IdentityPage(page, more=False, total=0 if found is None else 1)
        rows = await fetch_all(reader, _PAGE, (organization_id, after, limit + 1))
        total = await fetch_one(reader, _COUNT, (organization_id,))
        return IdentityPage(
            [identity_from_row(row) for row in rows[:limit]],
            more=len(rows) > limit,
            total=int(total[0]) if total else 0,
        )

    @timed
    async def identity_of(self, organization_id: str, external_id: str) -> Identity | None:
        """The identity of the organization's keys with ``external_id``."""
        return await identity_by_external_id(self._reader, organization_id, external_id)

    @timed
    async def keys_of(self, identity: Identity) -> list[str]:
        return await keys_of(self._reader, identity)

    @timed
    async def held_by_keys(self, organization_id: str, external_id: str) -> frozenset[str]:
        return await held_by_keys(self._reader, organization_id, external_id)


async def get_identity(conn: Connection, organization_id: str, identity_id: str) -> Identity | None:
    return _one(await fetch_all(conn, BY_ID, (organization_id, identity_id)))


async def identity_by_external_id(
    conn: Connection, organization_id: str, external_id: str
) -> Identity | None:
    return _one(await fetch_all(conn, BY_EXTERNAL_ID, (organization_id, external_id)))


async def keys_of(conn: Connection, identity: Identity) -> list[str]:
    """The UUIDs of the identity's keys, oldest first."""
    return await keys_with(conn, identity.organization_id, identity.external_id)


async def keys_with(conn: Connection, organization_id: str, external_id: str) -> list[str]:
    """The UUIDs of the organization's keys with ``external_id``, oldest first: its
    identity's keys, or those an identity of it made now would have."""
    rows = await fetch_all(conn, _KEYS_OF, (organization_id, external_id))
    return [row["id"] for row in rows]


async def held_by_keys(conn: Connection, organization_id: str, external_id: str) -> frozenset[str]:
    """Every permission any of the organization's keys with ``external_id`` holds."""
    keys = set(await keys_with(conn, organization_id, external_id))
    return await permissions_of_keys(conn, organization_id, keys)


async def next_place(conn: Connection, organization_id: str) -> int:
    """The org_seq a new identity of the organization takes (writes are serialized)."""
    row = await fetch_one(conn, _NEXT_SEQ, (organization_id,))
    return int(row[0])


def _values(identity: Identity) -> tuple[object, ...]:
    """meta to credits_flags, as stored."""
    credits = identity.credits
    return (
        None if identity.meta is None else json.dumps(identity.meta),
        identity.ratelimits,
        *credits_params(credits),
        0 if credits is None else credits_flags(credits),
    )


async def insert_identity(conn: Connection, identity: Identity) -> None:
    await conn.execute(
        _INSERT,
        (
            identity.id,
            identity.organization_id,
            identity.org_seq,
            identity.external_id,
            *_values(identity),
            to_text(identity.created_at),
            to_text(identity.updated_at),
        ),
    )


async def update_identity(conn: Connection, identity: Identity) -> None:
    """Write the identity's meta, limits, credits and updatedAt."""
    await conn.execute(_UPDATE, (*_values(identity), to_text(identity.updated_at), identity.id))


async def delete_identity(conn: Connection, identity_id: str) -> None:
    await conn.execute(_DELETE, (identity_id,))
