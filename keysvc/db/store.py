"""The data layer's front: one ``Store`` per database, holding its connections, and
``open_checked``, which opens one ready to serve.

Connections: one writer (``keysvc.db.connections.Writer``), guarded by a lock so
that each write runs in its own ``BEGIN IMMEDIATE`` transaction; one reader,
which in WAL mode sees only committed data; one synchronous "watcher" used on
the event loop for a single cheap question, has anything been committed since
I last looked (``keysvc.db.freshness``); and the create batches' own
(``keysvc.db.createbatch``). The caches are ``caches``'s (``keysvc.db.cache``),
role SQL is ``roles``'s (``keysvc.db.roles``).

The domain (``keysvc.keys``, ``keysvc.roles``) runs its writes in
``transaction()`` and checks its rules there; the store checks none of them.
It returns dataclasses, never cursors, and knows nothing of HTTP beyond
raising keysvc's own errors.
"""

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

import aiosqlite

from keysvc.config import ConfigError, Settings
from keysvc.credentials import ACTIVITY_CHAIN, Hasher, load_pepper
from keysvc.db import activities as activity_sql
from keysvc.db import keys as key_sql
from keysvc.db import meta
from keysvc.db.batching import Creates, RevokedUses, Touches
from keysvc.db.cache import Caches
from keysvc.db.connections import (
    Writer,
    connect,
    fetch_all,
    fetch_one,
    require_existing,
    unusable,
)
from keysvc.db.createbatch import Announce, Recheck
from keysvc.db.freshness import Freshness
from keysvc.db.migrations import migrate
from keysvc.db.roles import RoleStore
from keysvc.db.timing import Observer, timed
from keysvc.diskspace import DiskSpace
from keysvc.models import Activity, ActivityPage, Credential, Key, KeyPage, NewKey


class Store:
    def __init__(
        self,
        writer: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        watcher: sqlite3.Connection,
        *,
        path: Path,
        observer: Observer | None = None,
        cache_size: int = 10_000,
    ):
        self.reader = reader
        self._freshness = Freshness(watcher, path)
        self.caches = Caches(self._freshness, cache_size)
        self.writer = Writer(writer, DiskSpace(path), self.caches.authorization_changed)
        # Whether writes find the disk full (keysvc.diskspace), for every write path.
        self.space = self.writer.space
        # The activity log's chain key: set once the pepper is loaded (open_checked).
        self.chain = activity_sql.Chain()
        self._creates = Creates(path, self.writer, self.chain)
        self._touches = Touches(self.writer)
        self._revoked_uses = RevokedUses(self.writer, self.chain)
        self.needs_touch = self._touches.needs_touch  # type: ignore[method-assign]
        self.observer = observer
        self.roles = RoleStore(reader, observer)

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        observer: Observer | None = None,
        cache_size: int = 10_000,
        create: bool = True,
    ) -> "Store":
        writer = await connect(path, create=create)
        try:
            await migrate(writer, create=create)
            reader = await connect(path)
        except BaseException:
            await writer.close()
            raise
        watcher = sqlite3.connect(path, isolation_level=None)
        store = cls(writer, reader, watcher, path=path, observer=observer, cache_size=cache_size)
        try:
            await store._creates.open()
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        flushers = [
            t
            for t in (self._creates.flusher, self._touches.flusher, self._revoked_uses.flusher)
            if t is not None
        ]
        await asyncio.gather(*flushers, return_exceptions=True)
        self._freshness.close_connection()
        await self.reader.close()
        await self.writer.close()
        await self._creates.thread.close()
        self._freshness.release()  # last: sooner would drop SQLite's locks (freshness)

    @asynccontextmanager
    async def transaction(self, operation: str) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction (``Writer.transaction``), for the domain to read, check
        its rules and write in. Its duration, waiting for the write lock included, is
        reported to the observer as ``operation``'s, as ``timed`` reports a call's: the
        name is required, so that no write goes unmeasured."""
        observer = self.observer
        started = time.perf_counter()
        try:
            async with self.writer.transaction() as conn:
                yield conn
        finally:
            if observer is not None:
                observer(operation, time.perf_counter() - started)

    async def authorization_changed(self, conn: aiosqlite.Connection) -> None:
        """Inside a transaction: what some key may do has changed. Bumps the generation."""
        await self.writer.authorization_changed(conn)

    # The database as a whole

    @timed
    async def recorded_pepper(self) -> str | None:
        """The fingerprint of the pepper this database was made with; None when new."""
        return await meta.recorded_pepper(self.reader)

    @timed
    async def check_writable(self) -> None:
        """Fail now (sqlite3.OperationalError) if this process cannot write the
        database, rather than at a client's first write. Nothing is kept."""
        await self.writer.check_writable()

    @timed
    async def check_pepper(self, fingerprint: str) -> None:
        """Record the pepper's fingerprint on first start; refuse a different pepper later."""
        async with self.writer.transaction() as conn:
            await meta.check_pepper(conn, fingerprint)

    @timed
    async def schema_is_current(self) -> bool:
        """True when the database answers and its schema is the one this code expects."""
        return await meta.schema_is_current(self.reader)

    @timed
    async def has_organization(self) -> bool:
        return await meta.has_organization(self.reader)

    @timed
    async def organization_ids(self) -> list[str]:
        """Every organization's ID, oldest first."""
        return await meta.organization_ids(self.reader)

    async def record(self, conn: aiosqlite.Connection, activity: Activity) -> None:
        """Inside a write transaction: log ``activity`` (``keysvc.db.activities.record``)."""
        await activity_sql.record(conn, self.chain, activity)

    async def key_activities(self, key: bytes) -> None:
        """Key the activity chains (from the pepper), and give each organization
        without a chain head an empty one."""
        self.chain.keyed(key)
        async with self.writer.transaction() as conn:
            await activity_sql.seal_heads(conn, self.chain)

    # Keys

    @timed
    async def create_key(
        self, new: NewKey, max_keys: int, announce: Announce, recheck: Recheck | None = None
    ) -> Key:
        """Store a key; answered only once the transaction holding it has committed
        (``keysvc.db.batching``), in which ``recheck``, the domain's rule, runs again,
        and the activity ``announce`` makes of the key is recorded."""
        return await self._creates.create(new, max_keys, announce, recheck)

    @timed
    async def get_key(self, organization_id: str, key_id: str) -> Key | None:
        """The key as committed now: from the cache only if nothing was committed since."""
        caches = self.caches
        cached = caches.cached_key(organization_id, key_id)
        if cached is not None:
            return cached
        version = caches.data_version()  # read before the row, so a later commit is not hidden
        generation = caches.generation
        row = await fetch_one(self.reader, key_sql.CREDENTIAL_BY_ID, (key_id, organization_id))
        if row is None:
            return None
        (key,) = await key_sql.keys_from_rows(self.reader, [row])
        caches.refresh_key(Credential(key, row["secret_hash"]), version, generation)
        return key

    @timed
    async def list_keys(self, organization_id: str, after: int, limit: int) -> KeyPage:
        """Keys oldest first, after the organization's ``after``-th key (``Key.org_seq``):
        a keyset page, as cheap at page N as page 1."""
        keys, more, total = await key_sql.list_page(self.reader, organization_id, after, limit)
        return KeyPage(keys=keys, more=more, total=total)

    async def find_credential(self, key_id_hash: bytes) -> Credential | None:
        """The credential for a keyed key-ID hash: cached, unless authorization moved since."""
        caches = self.caches
        version = caches.data_version()
        generation = caches.generation
        entry = caches.credentials.get(key_id_hash)
        if entry is not None:
            return entry.credential
        row = await fetch_one(self.reader, key_sql.CREDENTIAL, (key_id_hash,))
        if row is None:
            return None
        (key,) = await key_sql.keys_from_rows(self.reader, [row])
        credential = Credential(key=key, secret_hash=row["secret_hash"])
        caches.keep_credential(key_id_hash, credential, version, generation)
        return credential

    async def read_as_uncached(
        self, key_id_hash: bytes, found: Credential | None, done: int
    ) -> None:
        """The reads ``find_credential`` makes for an uncached key (its row, then its
        roles) that a failed authentication has not made yet (``done`` of them), with
        their answers unused. A wrong secret for a cached key and an unknown key ID
        then cost the caller the same two reads as a wrong secret for an uncached key,
        so that the time of a 401 does not tell them apart (docs/SECURITY.md)."""
        if done < 1:
            await fetch_one(self.reader, key_sql.CREDENTIAL, (key_id_hash,))
        if done < 2:
            # An unknown ID's roles are those of no key: the same query, finding none.
            key_ids = [found.key.id if found is not None else str(uuid.uuid4())]
            await fetch_all(self.reader, key_sql.ROLES_OF_KEYS, (json.dumps(key_ids),))

    def note_revoked_use(self, key_id: str, moment: datetime, make: Callable[[], Activity]) -> None:
        """Record the activity ``make`` returns, a use of a revoked key, unless one was
        this minute (``RevokedUses``); written later, never on the request's path."""
        self._revoked_uses.note(key_id, moment, make)

    # The activity log

    @timed
    async def get_activity(self, organization_id: str, activity_id: str) -> Activity | None:
        return await activity_sql.get(self.reader, organization_id, activity_id)

    @timed
    async def list_activities(
        self,
        organization_id: str,
        after: int,
        limit: int,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> ActivityPage:
        """Oldest first, after the organization's ``after``-th record (a keyset page)."""
        return await activity_sql.page(self.reader, organization_id, after, limit, since, until)

    def needs_touch(self, key: Key, minute: datetime) -> bool:
        """Whether ``key``'s usedAt is behind ``minute``, as far as this process knows
        (``Touches.needs_touch``; bound over this method in ``__init__``, as it is
        asked on every authenticated request)."""
        return self._touches.needs_touch(key, minute)

    @timed
    async def touch_used(self, key_id: str, minute: datetime) -> None:
        """Set usedAt to ``minute`` unless it is already there (``Touches.touch``)."""
        await self._touches.touch(key_id, minute)


@asynccontextmanager
async def open_checked(
    settings: Settings, *, observer: Observer | None = None, create: bool = True
) -> AsyncIterator[tuple[Store, Hasher]]:
    """The store for ``settings``, migrated, writable and checked against its pepper;
    closed on exit. ``create=False``: the database must exist already
    (``keysvc.db.connections``).

    A database that cannot be used stops here with a ConfigError naming its path.
    """
    path = settings.db_path
    if not create:
        require_existing(path)
    try:
        store = await Store.open(
            path, observer=observer, cache_size=settings.cache_size, create=create
        )
    except sqlite3.Error as exc:
        raise unusable(path, exc) from None
    except ConfigError as exc:
        raise ConfigError(f"database {path}: {exc}") from None
    try:
        try:
            await store.check_writable()
        except sqlite3.Error as exc:
            raise unusable(path, exc) from None
        recorded = await store.recorded_pepper()
        pepper = load_pepper(settings.pepper, settings.pepper_path, create=recorded is None)
        hasher = Hasher(pepper)
        await store.check_pepper(hasher.fingerprint())
        await store.key_activities(hasher.derive(ACTIVITY_CHAIN))
        yield store, hasher
    finally:
        await store.close()
