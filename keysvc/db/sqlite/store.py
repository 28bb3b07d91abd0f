"""SQLite's store: one file, served by one process's connections.

Connections: one writer (``keysvc.db.sqlite.connections.Writer``), guarded by a lock so
that each write runs in its own ``BEGIN IMMEDIATE`` transaction; one reader, which in
WAL mode sees only committed data; a point reader on the loop
(``keysvc.db.sqlite.pointreads``); one synchronous "watcher" asking whether anything
was committed since it last looked (``keysvc.db.sqlite.freshness``); and the create
batches' own (``keysvc.db.sqlite.createbatch``). What both backends answer alike is
``keysvc.db.core.StoreCore``'s, which this store holds.
"""

import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timedelta
from pathlib import Path

import aiosqlite

from keysvc.config import ConfigError, Settings
from keysvc.credentials import ACTIVITY_CHAIN, Hasher, load_pepper
from keysvc.db import meta
from keysvc.db.batching import RevokedUse
from keysvc.db.cache import Caches
from keysvc.db.contract import NO_RECORDS, Connection, Records, SharedCountStore
from keysvc.db.core import StoreCore, UsageUpkeep, upkeep_of
from keysvc.db.keys import Announce, Recheck
from keysvc.db.keystates import KeyStates
from keysvc.db.quota import Quota
from keysvc.db.sqlite.connections import (
    Writer,
    connect,
    connect_point_reader,
    require_existing,
    unusable,
)
from keysvc.db.sqlite.createbatch import Creates
from keysvc.db.sqlite.diskspace import DiskSpace
from keysvc.db.sqlite.freshness import Freshness
from keysvc.db.sqlite.migrations import migrate
from keysvc.db.sqlite.pointreads import PointReader
from keysvc.db.timing import Observer, timed
from keysvc.errors import DatabaseUnavailable
from keysvc.models import Activity, ActivityKinds, ActivityPage, Credential, Key, KeyPage, NewKey

logger = logging.getLogger("keysvc")


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
        records: Records = NO_RECORDS,
    ):
        self._path = path
        self.reader = reader
        self.points = PointReader(connect_point_reader(path), reader)
        self._freshness = Freshness(watcher, path)
        self.caches = Caches(self._freshness, cache_size)
        self.writer = Writer(writer, DiskSpace(path), self.caches.authorization_changed)
        self.observer = observer
        core = self._core = StoreCore(
            self.reader, self.points, self.writer, self.caches, observer, records
        )
        self.space = core.space
        self.chain = core.chain
        self.roles = core.roles
        # Asked on every authenticated request, so bound once rather than forwarded.
        self.needs_touch = core.touches.needs_touch
        self.count_use = core.touches.tally.add
        self._creates = Creates(path, self.writer, self.chain, records)

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        observer: Observer | None = None,
        cache_size: int = 10_000,
        create: bool = True,
        upkeep: UsageUpkeep | None = None,
        records: Records = NO_RECORDS,
    ) -> "Store":
        """``upkeep``: write and prune the usage counts in the background, as a
        serving store does; without it they are written with usedAt and at close."""
        writer = await connect(path, create=create)
        try:
            await migrate(writer, create=create)
            reader = await connect(path)
        except BaseException:
            await writer.close()
            raise
        watcher = sqlite3.connect(path, isolation_level=None)
        store = cls(
            writer, reader, watcher, path=path, observer=observer, cache_size=cache_size,
            records=records,
        )  # fmt: skip
        try:
            await store._creates.open()
        except BaseException:
            await store.close()
            raise
        store._core.start_upkeep(upkeep)
        return store

    async def close(self) -> None:
        await self._core.finish_writes(self._creates.flusher)
        self._freshness.close_connection()
        self.points.close()
        await self.reader.close()
        await self.writer.close()
        await self._creates.thread.close()
        self._freshness.release()  # last: sooner would drop SQLite's locks (freshness)

    # What only SQLite answers this way

    def key_counts(self, every: timedelta, observer: Observer | None) -> KeyStates:
        """Counted on a connection and a thread of their own (``keysvc.db.keystates``)."""
        return KeyStates(self._path, every=every, observer=observer)

    @asynccontextmanager
    async def delivery_reader(self) -> AsyncIterator[Connection]:
        """A connection of its own, so that the webhook task's reads neither wait
        behind nor delay the API's."""
        conn = await connect(self._path, create=False)
        try:
            yield conn
        finally:
            await conn.close()

    def shared_counts(self) -> SharedCountStore | None:
        """None: one process serves the file, and counts failed logins in its memory."""
        return None

    @timed
    async def check_writable(self) -> None:
        """Fail now (sqlite3.OperationalError) if this process cannot write the
        database, rather than at a client's first write. Nothing is kept."""
        await self.writer.check_writable()

    @timed
    async def schema_is_current(self) -> bool:
        """Whether its schema is the one this code expects; DatabaseUnavailable when
        the database does not answer."""
        try:
            return await meta.schema_is_current(self.reader)
        except (sqlite3.Error, ValueError) as exc:
            logger.warning("the database does not answer: %s", exc)
            raise DatabaseUnavailable("the database does not answer") from None

    @timed
    async def create_key(
        self, new: NewKey, max_keys: int, announce: Announce, recheck: Recheck | None = None
    ) -> Key:
        """Store a key; answered only once the transaction holding it has committed
        (``keysvc.db.sqlite.createbatch``), in which ``recheck``, the domain's rule, runs
        again, and the activity ``announce`` makes of the key is recorded."""
        return await self._creates.create(new, max_keys, announce, recheck)

    # The contract's calls both backends answer alike (``StoreCore``).

    def transaction(self, operation: str) -> AbstractAsyncContextManager[Connection]:
        """One write transaction (``StoreCore.transaction``)."""
        return self._core.transaction(operation)

    def authorization_changed(self, conn: Connection) -> Awaitable[None]:
        """Inside a transaction: what some key may do has changed. Bumps the generation."""
        return self.writer.authorization_changed(conn)

    def record(self, conn: Connection, activity: Activity) -> Awaitable[None]:
        return self._core.record(conn, activity)

    @property
    def quota(self) -> Quota:
        return self._core.quota

    def recorded_pepper(self) -> Awaitable[str | None]:
        return self._core.recorded_pepper()

    def check_pepper(self, fingerprint: str) -> Awaitable[None]:
        return self._core.check_pepper(fingerprint)

    def key_activities(self, key: bytes) -> Awaitable[None]:
        return self._core.key_activities(key)

    def has_organization(self) -> Awaitable[bool]:
        return self._core.has_organization()

    def organization_ids(self) -> Awaitable[list[str]]:
        return self._core.organization_ids()

    def get_key(self, organization_id: str, key_id: str) -> Awaitable[Key | None]:
        return self._core.get_key(organization_id, key_id)

    def list_keys(self, organization_id: str, after: int, limit: int) -> Awaitable[KeyPage]:
        return self._core.list_keys(organization_id, after, limit)

    def find_credential(self, key_id_hash: bytes) -> Awaitable[Credential | None]:
        return self._core.find_credential(key_id_hash)

    def read_as_uncached(self, key_id_hash: bytes) -> Awaitable[None]:
        return self._core.read_as_uncached(key_id_hash)

    def note_revoked_use(
        self, key_id: str, moment: datetime, make: Callable[[], RevokedUse]
    ) -> None:
        self._core.note_revoked_use(key_id, moment, make)

    def get_activity(self, organization_id: str, activity_id: str) -> Awaitable[Activity | None]:
        return self._core.get_activity(organization_id, activity_id)

    def list_activities(
        self,
        organization_id: str,
        after: int,
        limit: int,
        since: datetime | None = None,
        until: datetime | None = None,
        kinds: ActivityKinds | None = None,
        max_bytes: int | None = None,
    ) -> Awaitable[ActivityPage]:
        return self._core.list_activities(
            organization_id, after, limit, since, until, kinds, max_bytes
        )

    def touch_used(self, key_id: str, minute: datetime) -> Awaitable[None]:
        return self._core.touch_used(key_id, minute)

    def write_usage(self) -> Awaitable[None]:
        """Write this process's usage counts now, rather than at the next flush."""
        return self._core.touches.write_counts()

    def usage_series(
        self, key_id: str, start: datetime, end: datetime, width: int
    ) -> Awaitable[Mapping[str, Sequence[int]]]:
        return self._core.usage_series(key_id, start, end, width)


@asynccontextmanager
async def open_checked(
    settings: Settings,
    *,
    observer: Observer | None = None,
    create: bool = True,
    serving: bool = False,
    records: Records = NO_RECORDS,
) -> AsyncIterator[tuple[Store, Hasher]]:
    """The store for ``settings``, migrated, writable and checked against its pepper;
    closed on exit. ``create=False``: the database must exist already
    (``keysvc.db.sqlite.connections``). ``serving``: keep the usage counts (``UsageUpkeep``).

    A database that cannot be used stops here with a ConfigError naming its path.
    """
    path = settings.db_path
    if not create:
        require_existing(path)
    try:
        store = await Store.open(
            path,
            observer=observer,
            cache_size=settings.cache_size,
            create=create,
            upkeep=upkeep_of(settings) if serving else None,
            records=records,
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
