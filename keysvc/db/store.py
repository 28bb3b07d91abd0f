"""The data layer's front: one ``Store`` per database, holding its connections, and
``open_checked``, which opens one ready to serve.

Connections: one writer (``keysvc.db.connections.Writer``), guarded by a lock so
that each write runs in its own ``BEGIN IMMEDIATE`` transaction; one reader,
which in WAL mode sees only committed data; one synchronous "watcher" used on
the event loop for a single cheap question, has anything been committed since
I last looked (``keysvc.db.freshness``); and the create batches' own
(``keysvc.db.createbatch``). The caches are ``caches``'s (``keysvc.db.cache``),
role SQL is ``roles``'s (``keysvc.db.roles``). Opened to serve, it also keeps the
usage counts (``keysvc.db.usage``): written every flush interval and at close,
and pruned past their retention at most every ``PRUNE_EVERY_SECONDS``, when it
also drops the previous credentials of rotations whose grace has ended and the
tombstones of keys deleted longer ago than that retention.

The domain (``keysvc.domain.keys``, ``keysvc.domain.roles``) runs its writes in
``transaction()`` and checks its rules there; the store checks none of them.
It returns dataclasses, never cursors, and knows nothing of HTTP beyond
raising keysvc's own errors.
"""

import asyncio
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import aiosqlite

from keysvc.config import ConfigError, Settings
from keysvc.credentials import ACTIVITY_CHAIN, Hasher, load_pepper
from keysvc.db import activities as activity_sql
from keysvc.db import keys as key_sql
from keysvc.db import meta
from keysvc.db import roles as role_sql
from keysvc.db import usage as usage_sql
from keysvc.db.batching import Creates, RevokedUse, RevokedUses, Touches
from keysvc.db.cache import Caches
from keysvc.db.connections import (
    Writer,
    connect,
    connect_point_reader,
    require_existing,
    unusable,
)
from keysvc.db.createbatch import Announce, Recheck
from keysvc.db.diskspace import DiskSpace
from keysvc.db.freshness import Freshness
from keysvc.db.migrations import migrate
from keysvc.db.pointreads import PointReader
from keysvc.db.roles import RoleStore
from keysvc.db.rows import key_from_joined
from keysvc.db.timing import Observer, timed
from keysvc.domain import activities
from keysvc.models import Activity, ActivityKinds, ActivityPage, Credential, Key, KeyPage, NewKey
from keysvc.timeutil import utcnow

logger = logging.getLogger("keysvc")


@dataclass(frozen=True)
class UsageUpkeep:
    """How a serving store keeps the usage counts: written every ``flush_seconds``,
    rows older than ``retention`` pruned."""

    flush_seconds: float
    retention: timedelta


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
        self.points = PointReader(connect_point_reader(path), reader)
        self._freshness = Freshness(watcher, path)
        self.caches = Caches(self._freshness, cache_size)
        self.writer = Writer(writer, DiskSpace(path), self.caches.authorization_changed)
        self._on_writer(observer)
        self._creates = Creates(path, self.writer, self.chain)

    def _on_writer(self, observer: Observer | None) -> None:
        """What the store builds on ``reader`` and ``writer``, whatever the backend."""
        # Whether writes find the disk full (keysvc.db.diskspace), for every write path.
        self.space = self.writer.space
        # The activity log's chain key: set once the pepper is loaded (open_checked).
        self.chain = activity_sql.Chain()
        self._touches = Touches(self.writer)
        self._revoked_uses = RevokedUses(self.writer, self.chain)
        # Asked on every authenticated request, so bound once rather than forwarded.
        self.needs_touch = self._touches.needs_touch
        self.count_use = self._touches.tally.add
        self._upkeep: asyncio.Task[None] | None = None
        self.observer = observer
        self.roles = RoleStore(self.reader, observer)

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        observer: Observer | None = None,
        cache_size: int = 10_000,
        create: bool = True,
        upkeep: UsageUpkeep | None = None,
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
        store = cls(writer, reader, watcher, path=path, observer=observer, cache_size=cache_size)
        try:
            await store._creates.open()
        except BaseException:
            await store.close()
            raise
        if upkeep is not None:
            store._upkeep = asyncio.create_task(store._keep_usage(upkeep))
        return store

    async def _keep_usage(self, upkeep: UsageUpkeep) -> None:
        """Write the usage counts every flush interval; prune old rows now, then at
        most every PRUNE_EVERY_SECONDS, and with them drop the previous credentials
        of rotations whose grace has ended and the tombstones of keys deleted before the
        retention. A failure is logged and tried again later."""
        pruned_at: float | None = None
        while True:
            if pruned_at is None or time.monotonic() - pruned_at >= usage_sql.PRUNE_EVERY_SECONDS:
                pruned_at = time.monotonic()
                now = utcnow()
                await self._tidy(
                    "prune_usage", "pruning old usage counts",
                    usage_sql.prune, now - upkeep.retention,
                )  # fmt: skip
                await self._tidy(
                    "drop_ended_credentials", "dropping the credentials of ended graces",
                    key_sql.drop_ended_previous, now,
                )  # fmt: skip
                await self._tidy(
                    "prune_tombstones", "pruning the tombstones of deleted keys",
                    key_sql.prune_tombstones, now - upkeep.retention,
                )  # fmt: skip
            await asyncio.sleep(upkeep.flush_seconds)
            await self._touches.write_counts()

    async def _tidy(
        self,
        operation: str,
        doing: str,
        work: Callable[[aiosqlite.Connection, datetime], Awaitable[None]],
        moment: datetime,
    ) -> None:
        """One upkeep write in its own transaction; a failure is logged, and the next
        round tries again."""
        try:
            async with self.transaction(operation) as conn:
                await work(conn, moment)
        except Exception:
            logger.exception("%s failed; trying again later", doing)

    async def close(self) -> None:
        await self._finish_writes(self._creates.flusher)
        self._freshness.close_connection()
        self.points.close()
        await self.reader.close()
        await self.writer.close()
        await self._creates.thread.close()
        self._freshness.release()  # last: sooner would drop SQLite's locks (freshness)

    async def _finish_writes(self, *flushers: asyncio.Task[None] | None) -> None:
        """Stop the upkeep, write the counts not yet written (so that a clean stop loses
        none), and wait for every write under way, ``flushers`` too."""
        if self._upkeep is not None:
            self._upkeep.cancel()
            await asyncio.gather(self._upkeep, return_exceptions=True)
        await self._touches.write_counts()
        running = (*flushers, self._touches.flusher, self._revoked_uses.flusher)
        await asyncio.gather(*(t for t in running if t is not None), return_exceptions=True)

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
        """Key the activity chains (from the pepper), and start the chain of each
        organization without a head: with a create record of each key and custom role
        it holds (those of a database from before the log), or an empty head."""
        self.chain.keyed(key)
        async with self.writer.transaction() as conn:
            for organization_id in await activity_sql.unheaded(conn):
                existing = await _existing(conn, organization_id, utcnow())
                await activity_sql.seal(conn, self.chain, organization_id, existing)

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
        rows = await self.points.rows(key_sql.KEY_BY_ID_JOINED, (key_id, organization_id))
        key = key_from_joined(rows)
        if key is not None:
            caches.refresh_key(key, version, generation)
        return key

    @timed
    async def list_keys(self, organization_id: str, after: int, limit: int) -> KeyPage:
        """Keys oldest first, after the organization's ``after``-th key (``Key.org_seq``):
        a keyset page, as cheap at page N as page 1."""
        keys, more, total = await key_sql.list_page(self.reader, organization_id, after, limit)
        return KeyPage(keys=keys, more=more, total=total)

    async def find_credential(self, key_id_hash: bytes) -> Credential | None:
        """The credential for a keyed key-ID hash, current or previous (``Credential.until``):
        cached, unless authorization moved since."""
        caches = self.caches
        version = caches.data_version()
        generation = caches.generation
        entry = caches.credentials.get(key_id_hash)
        if entry is not None:
            return entry.credential
        rows = await self.points.rows(
            key_sql.CREDENTIAL_JOINED, key_sql.credential_params(key_id_hash)
        )
        key = key_from_joined(rows)
        if key is None:
            return None
        credential = key_sql.credential_of(key, rows[0])
        if not credential.deleted:  # a tombstone is never cached as a credential
            caches.keep_credential(key_id_hash, credential, version, generation)
        return credential

    async def read_as_uncached(self, key_id_hash: bytes) -> None:
        """The read ``find_credential`` makes for an uncached key (its row joined with its
        roles', one statement), with its answer unused: a wrong secret for a cached key
        then costs the caller the same read as an unknown key ID or a wrong secret for
        an uncached key, so that the time of a 401 does not tell them apart
        (docs/SECURITY.md)."""
        await self.points.rows(key_sql.CREDENTIAL_JOINED, key_sql.credential_params(key_id_hash))

    def note_revoked_use(
        self, key_id: str, moment: datetime, make: Callable[[], RevokedUse]
    ) -> None:
        """Record the use of a revoked key ``make`` returns (its activity and its
        ``key.used_after_revoke`` event), unless one was this minute (``RevokedUses``);
        written later, never on the request's path."""
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
        kinds: ActivityKinds | None = None,
    ) -> ActivityPage:
        """Oldest first, after the organization's ``after``-th record (a keyset page), of
        ``kinds`` only (None: every record)."""
        return await activity_sql.page(
            self.reader, organization_id, after, limit, since, until, kinds
        )

    needs_touch: Callable[[Key, datetime], bool]
    """Whether ``key``'s usedAt is behind ``minute``, as far as this process knows
    (``Touches.needs_touch``, bound in ``__init__``)."""

    @timed
    async def touch_used(self, key_id: str, minute: datetime) -> None:
        """Set usedAt to ``minute`` unless it is already there (``Touches.touch``)."""
        await self._touches.touch(key_id, minute)

    count_use: Callable[[str, datetime, int], None]
    """Count one authentication of ``key_id`` in ``minute``, ``outcome`` indexing
    ``keysvc.db.usage.OUTCOMES``; written later (``Tally.add``, bound in ``__init__``)."""

    async def write_usage(self) -> None:
        """Write this process's usage counts now, rather than at the next flush."""
        await self._touches.write_counts()

    @timed
    async def usage_series(
        self, key_id: str, start: datetime, end: datetime, width: int
    ) -> Mapping[str, Sequence[int]]:
        """The key's usage counts from ``start`` up to ``end`` as written, summed by
        bucket (``keysvc.db.usage.series``)."""
        return await usage_sql.series(self.reader, key_id, start, end, width)


async def _existing(
    conn: aiosqlite.Connection, organization_id: str, now: datetime
) -> list[Activity]:
    """The create records of what an organization from before the log holds: its
    custom roles (with their holders), then its keys, oldest first."""
    found = [
        activities.role_created(detail, activities.PRE_LOG, now)
        for detail in await role_sql.custom_roles(conn, organization_id)
    ]
    after, more = 0, True
    while more:
        keys, more, _ = await key_sql.list_page(conn, organization_id, after, 500)
        found += [activities.key_created(key, activities.PRE_LOG, now) for key in keys]
        after = keys[-1].org_seq if keys else after
    return found


def upkeep_of(settings: Settings) -> UsageUpkeep:
    retention = timedelta(days=settings.usage_retention_days)
    return UsageUpkeep(settings.usage_flush_seconds, retention)


@asynccontextmanager
async def open_checked(
    settings: Settings,
    *,
    observer: Observer | None = None,
    create: bool = True,
    serving: bool = False,
) -> AsyncIterator[tuple[Store, Hasher]]:
    """The store for ``settings``, migrated, writable and checked against its pepper;
    closed on exit. ``create=False``: the database must exist already
    (``keysvc.db.connections``). ``serving``: keep the usage counts (``UsageUpkeep``).

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
