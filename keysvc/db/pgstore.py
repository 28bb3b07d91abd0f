"""The data layer's front on PostgreSQL: ``PgStore``, which answers every call the
domain makes of ``keysvc.db.store.Store`` with the same SQL functions, run on
PostgreSQL connections (``keysvc.db.pgconn``), for several keysvc instances sharing
one database.

What stands in for SQLite's machinery:

- The single writer and ``BEGIN IMMEDIATE``: every write transaction first takes one
  transaction-level advisory lock (``WRITE_LOCK``), held until it commits or rolls
  back, by whichever instance. Writes are as serial as on SQLite, across instances,
  so the domain's read-check-write rules (the per-organization key cap, the roles'
  rules, each activity chain's next link) hold as they do on one SQLite file.
- The create batches: a create is a transaction of its own under that lock, in
  which the domain's rule runs again (``Recheck``) and the key cap is counted.
- Point reads on the loop and the reader: a pool of connections (``PgReader``).
- Freshness (``data_version`` and the WAL watch): ``Notifications``, LISTENing on a
  connection of its own. Each write transaction sends NOTIFY keysvc_data at commit,
  and a move of the authorization generation sends keysvc_auth (schema_postgres.sql's
  trigger, for changes by hand too). While that connection is down the caches are
  cold: every look is a new version and a new generation, so nothing cached is
  served and nothing read is kept, until it is back and listening again.
- The disk-full answer (507) and the file-mode checks are SQLite's: PostgreSQL's
  server owns its storage, and a write it refuses is a 500 like any failed statement.
"""

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from keysvc.db import activities as activity_sql
from keysvc.db import keys as key_sql
from keysvc.db import pgschema
from keysvc.db.cache import Caches
from keysvc.db.connections import fetch_all, fetch_one
from keysvc.db.createbatch import GRANTED_ROLES, Announce, Recheck, over_limit
from keysvc.db.freshness import GENERATION
from keysvc.db.outbox import enqueue
from keysvc.db.pgconn import PgConnection, refusal
from keysvc.db.rows import role_from_row
from keysvc.db.store import Store, UsageUpkeep
from keysvc.db.timing import Observer
from keysvc.models import Key, NewKey
from keysvc.render import api_key

logger = logging.getLogger("keysvc")

# What opening a store may raise for an unreachable or refused database.
CONNECT_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)
# The advisory lock every write transaction holds (pgschema's MIGRATION_LOCK is another).
WRITE_LOCK = 0x6B657977
DATA_CHANNEL = "keysvc_data"
AUTH_CHANNEL = "keysvc_auth"
# How often the listening connection is checked, and a lost one tried again: the
# longest a dead connection can go unnoticed is about this plus PROBE_TIMEOUT.
PROBE_SECONDS = 1.0
PROBE_TIMEOUT = 2.0
_BUMP_GENERATION = (
    "update meta set value = (value::bigint + 1)::text where name = 'auth_generation'"
)
_SET_GENERATION = "update meta set value = ? where name = 'auth_generation'"


class PgReader:
    """Reads on pooled connections, each statement on whichever is free: what SQLite's
    reader connection answers, with the same calls (``execute_fetchall``)."""

    def __init__(self, pool: Any):
        self._pool = pool

    async def execute_fetchall(self, sql: str, params: Any = ()) -> list[Any]:
        async with self._pool.acquire() as raw:
            return await PgConnection(raw).execute_fetchall(sql, params)

    async def rows(self, sql: str, params: Any) -> list[Any]:
        """A point read (``keysvc.db.pointreads.PointReader.rows``)."""
        return await self.execute_fetchall(sql, params)


class Notifications:
    """``Freshness`` for PostgreSQL: a version that moves with every commit any
    instance announces, and the authorization generation as last announced."""

    def __init__(self, url: str):
        self._url = url
        self._version = 0
        self.generation: object = None
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        # Listening connections lost so far.
        self.losses = 0
        # Carried by this instance's own announcements (see is_own_commit).
        self.token = uuid.uuid4().hex

    def look(self) -> int:
        if not self.listening.is_set():
            # Cold: nothing read before can be known current, nor anything read now.
            self._version += 1
            self.generation = object()
        return self._version

    def committed(self) -> None:
        """This process committed: what it read before is not current any more."""
        self._version += 1

    def _heard(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if self.is_own_commit(channel, payload):
            return
        self._version += 1
        if channel == AUTH_CHANNEL:
            self.generation = payload

    async def start(self) -> None:
        await self._listen()
        self._task = asyncio.create_task(self._watch(), name="keysvc-notifications")

    async def _listen(self) -> None:
        conn = await asyncpg.connect(self._url)
        try:
            await conn.add_listener(DATA_CHANNEL, self._heard)
            await conn.add_listener(AUTH_CHANNEL, self._heard)
            # Listening before the generation is read: a move in between is heard.
            self.generation = await conn.fetchval(GENERATION)
        except BaseException:
            await conn.close()
            raise
        self._conn = conn
        self._version += 1
        self.listening.set()

    async def _watch(self) -> None:
        """Check the listening connection every PROBE_SECONDS; a lost one makes the
        caches cold until a new one listens."""
        while True:
            await asyncio.sleep(PROBE_SECONDS)
            try:
                if self._conn is None or self._conn.is_closed():
                    raise ConnectionError("the listening connection is closed")
                await self._conn.fetchval("select 1", timeout=PROBE_TIMEOUT)
            except Exception:
                if self.listening.is_set():
                    self.losses += 1
                    logger.warning("lost the PostgreSQL notification connection; caches off")
                self.listening.clear()
                await self._drop()
                try:
                    await self._listen()
                except Exception as exc:
                    # Tried again every PROBE_SECONDS; the loss itself was logged.
                    logger.debug("PostgreSQL notifications still down: %s", type(exc).__name__)
                    continue
                logger.warning("PostgreSQL notifications back; caches on")

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    @property
    def backend_pid(self) -> int | None:
        """The listening connection's server process, while there is one."""
        return None if self._conn is None else int(self._conn.get_server_pid())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.listening.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    def is_own_commit(self, channel: str, payload: str) -> bool:
        """Whether a notification is this instance's own commit heard back, which
        moved the version already (``committed``, called by the writer after every
        transaction that may have committed): counted again, it would make everything
        read since that commit look stale, and read again, once more."""
        return channel == DATA_CHANNEL and payload == self.token


class AlwaysRoom:
    """The disk-space watch SQLite needs (keysvc.diskspace), which PostgreSQL's server
    does for itself: a refused write is an error like any other."""

    full = False

    def failed(self, exc: Exception) -> Exception:
        return exc

    def succeeded(self) -> None:
        return None

    def ready(self) -> bool:
        return True


class PgWriter:
    """Write transactions: each on a pooled connection, under WRITE_LOCK."""

    def __init__(
        self, pool: Any, notifications: Notifications, on_authorization_changed: Callable[[], None]
    ):
        self._pool = pool
        self._notifications = notifications
        self._on_authorization_changed = on_authorization_changed
        self.space = AlwaysRoom()
        # Within the process too, one transaction at a time: waiting here costs no
        # pooled connection.
        self.lock = asyncio.Lock()
        self._authorization_changed = False

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgConnection]:
        async with self.lock, self._pool.acquire() as raw:
            self._authorization_changed = False
            committing = False
            try:
                async with raw.transaction():
                    await raw.execute("select pg_advisory_xact_lock($1)", WRITE_LOCK)
                    yield PgConnection(raw)
                    token = self._notifications.token
                    await raw.execute("select pg_notify($1, $2)", DATA_CHANNEL, token)
                    committing = True
            except asyncpg.IntegrityConstraintViolationError as exc:
                raise refusal(exc) from None
            except BaseException:
                if committing:  # the commit failed, or did it? (is_own_commit)
                    self._notifications.committed()
                raise
            self._notifications.committed()
            if self._authorization_changed:
                self._on_authorization_changed()

    async def authorization_changed(self, conn: PgConnection) -> None:
        await conn.execute(_BUMP_GENERATION)
        self._authorization_changed = True


class PgStore(Store):
    """``Store`` on PostgreSQL (see the module). Its own constructor: none of the
    SQLite store's connections are made. What it inherits runs on what it makes in
    their place (``reader``, ``points``, ``writer``, ``caches``); what it overrides
    touched SQLite itself."""

    def __init__(self, pool: Any, url: str, *, observer: Observer | None, cache_size: int):
        self._pool = pool
        self.notifications = Notifications(url)
        self.reader = PgReader(pool)  # type: ignore[assignment]
        # The point reads (get_key, find_credential) run on the pool as well.
        self.points = self.reader  # type: ignore[assignment]
        self.caches = Caches(self.notifications, cache_size)  # type: ignore[arg-type]
        self.writer = PgWriter(  # type: ignore[assignment]
            pool, self.notifications, self.caches.authorization_changed
        )
        self._on_writer(observer)

    @classmethod
    async def open_url(
        cls,
        url: str,
        *,
        observer: Observer | None = None,
        cache_size: int = 10_000,
        create: bool = True,
        upkeep: UsageUpkeep | None = None,
    ) -> "PgStore":
        pool = await asyncpg.create_pool(url, min_size=1, max_size=10, reset=keep_session)
        try:
            async with pool.acquire() as conn:
                await pgschema.migrate(conn, create=create)
            store = cls(pool, url, observer=observer, cache_size=cache_size)
            await store.notifications.start()
        except BaseException:
            await pool.close()
            raise
        if upkeep is not None:
            store._upkeep = asyncio.create_task(store._keep_usage(upkeep))
        return store

    async def close(self) -> None:
        await self._finish_writes()
        await self.notifications.close()
        await self._pool.close()

    async def check_writable(self) -> None:
        """Fail now if this role cannot write keysvc's tables; nothing is kept."""
        async with self._pool.acquire() as raw:
            transaction = raw.transaction()
            await transaction.start()
            try:
                await raw.execute(
                    "insert into meta (name, value) values ('write check', '')"
                    " on conflict (name) do update set value = excluded.value"
                )
            finally:
                await transaction.rollback()

    async def schema_is_current(self) -> bool:
        async with self._pool.acquire() as raw:
            return await pgschema.schema_is_current(raw)

    async def create_key(
        self, new: NewKey, max_keys: int, announce: Announce, recheck: Recheck | None = None
    ) -> Key:
        """One transaction: the key cap counted and the domain's rule run again under
        the write lock, the key and its roles inserted, its activity and its
        key.created event written. Its key_roles rows move the generation, which is
        put back: no cache can hold a key not yet committed."""
        async with self.transaction("create_key") as conn:
            org = new.organization_id
            generation = await fetch_one(conn, GENERATION, ())
            counted = await fetch_one(conn, key_sql.COUNT_KEYS, (org,))
            if counted is not None and counted[0] >= max_keys:
                raise over_limit(max_keys)
            if recheck is not None:
                ids = list(dict.fromkeys(new.role_ids))
                rows = await fetch_all(conn, GRANTED_ROLES, (json.dumps(ids),))
                refused = recheck(new, {row["id"]: role_from_row(row) for row in rows})
                if refused is not None:
                    raise refused
            key = await key_sql.insert_key(conn, new)
            await conn.execute(_SET_GENERATION, (generation[0] if generation else "0",))
            await activity_sql.record(conn, self.chain, announce(key))
            await enqueue(conn, org, "key.created", api_key(key), key.created_at)
            return key


async def keep_session(conn: Any) -> None:
    """The pool's reset of a connection given back: nothing beyond asyncpg's own (which
    rolls back a transaction left open). keysvc leaves no session state on a pooled
    connection (no SET, LISTEN, cursor or session-level lock: WRITE_LOCK and the
    migration's lock are transaction-level), so the default reset statement would only
    cost every read and write one more round trip."""
    return None
