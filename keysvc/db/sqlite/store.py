"""SQLite's store: one file, served by one process's connections.

Connections: one writer (``keysvc.db.sqlite.connections.Writer``), guarded by a lock so
that each write runs in its own ``BEGIN IMMEDIATE`` transaction; one reader, which in
WAL mode sees only committed data; a point reader on the loop
(``keysvc.db.sqlite.pointreads``); one synchronous "watcher" asking whether anything
was committed since it last looked (``keysvc.db.sqlite.freshness``); and the create
batches' own (``keysvc.db.sqlite.createbatch``), which the spend batches of credits
write on too (one hand-over to a thread a batch, its commit). What both backends answer alike is
``keysvc.db.core.StoreCore``'s, which this store holds.
"""

import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from functools import partial
from pathlib import Path

import aiosqlite

from keysvc.config import ConfigError, Settings
from keysvc.credentials import ACTIVITY_CHAIN, OUTBOX_SEAL, Hasher, load_pepper
from keysvc.db import meta
from keysvc.db.cache import Caches
from keysvc.db.contract import NO_RECORDS, Announce, Connection, Recheck, Records, SharedCountStore
from keysvc.db.core import StoreCore, upkeep_of
from keysvc.db.front import CoreFront
from keysvc.db.keystates import KeyStates
from keysvc.db.sqlite.connections import (
    Writer,
    connect,
    connect_point_reader,
    existing_uri,
    require_existing,
    unusable,
)
from keysvc.db.sqlite.createbatch import Creates
from keysvc.db.sqlite.diskspace import DiskSpace
from keysvc.db.sqlite.filewatch import FileWatch, mark_open, unmark
from keysvc.db.sqlite.freshness import Freshness
from keysvc.db.sqlite.migrations import migrate
from keysvc.db.sqlite.pointreads import PointReader
from keysvc.db.timing import Observer, timed
from keysvc.errors import DatabaseUnavailable
from keysvc.models import Key, NewKey

logger = logging.getLogger("keysvc")


class Store(CoreFront):
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
        self.file = FileWatch(path)
        mark_open(path)  # for the other processes (filewatch.refuse_split_index)
        self.points = PointReader(connect_point_reader(path), reader, self.file)
        self._freshness = Freshness(watcher, path)
        self.caches = Caches(self._freshness, cache_size)
        self.writer = Writer(writer, DiskSpace(path), self.caches.authorization_changed, self.file)
        self.observer = observer
        core = self._core = StoreCore(
            self.reader, self.points, self.writer, self.caches, observer, records
        )
        self._front(core)
        self._creates = Creates(path, self.writer, self.chain, self.seal, records)
        # Spend batches on the create batches' connection: one hand-over a batch.
        core.spend_writes = partial(self.writer.transaction, self._creates.thread.transaction)

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        observer: Observer | None = None,
        cache_size: int = 10_000,
        create: bool = True,
        records: Records = NO_RECORDS,
    ) -> "Store":
        """Migrated and open. No upkeep runs until ``start_upkeep``, called once the
        pepper has keyed the store (``open_checked``)."""
        writer = await connect(path, create=create)
        try:
            await migrate(writer, create=create)
            reader = await connect(path, create=False)  # the writer has made the file
        except BaseException:
            await writer.close()
            raise
        watcher = sqlite3.connect(existing_uri(path), isolation_level=None, uri=True)
        store = cls(
            writer, reader, watcher, path=path, observer=observer, cache_size=cache_size,
            records=records,
        )  # fmt: skip
        try:
            await store._creates.open()
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        await self._core.finish_writes(self._creates.flusher)
        self._freshness.close_connection()
        self.points.close()
        await self.reader.close()
        await self.writer.close()
        await self._creates.thread.close()
        self._freshness.release()  # last: sooner would drop SQLite's locks (freshness)
        unmark(self._path)  # as late, for the same reason

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
        the database does not answer, or its file is no longer the one opened
        (``keysvc.db.sqlite.filewatch``): readiness asks this, and so is what makes a
        lost write-ahead log's writes be copied into the file when no write comes."""
        if self.file.wal_to_save():
            async with self.writer.lock:
                await self.writer.keep_lost_wal()
        self.file.check()
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
        hasher = Hasher(pepper, settings.secret_prefix)
        await store.check_pepper(hasher.fingerprint())
        store.key_outbox(hasher.derive(OUTBOX_SEAL))
        await store.key_activities(hasher.derive(ACTIVITY_CHAIN))
        if serving:
            await store.start_upkeep(upkeep_of(settings))
        yield store, hasher
    finally:
        await store.close()
