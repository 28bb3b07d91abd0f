"""The store on PostgreSQL: ``PgStore``, the SQLite store's sibling under the contract
(``keysvc.db.contract.Store``), running the same SQL on a pool of PostgreSQL
connections (``keysvc.db.postgres.connection``) for several instances sharing one
database. ``PgWriter`` serializes writes with one row lock (``_WRITE_LOCK``), as
SQLite's single writer does; ``PgReader`` reads on the pool; ``Notifications``
(LISTEN/NOTIFY) stands in for SQLite's freshness watch, and a write that moved the
authorization generation returns once the other instances have heard of it. A
database that does not answer is a 503 (``Outage``). How each piece stands in for
SQLite's, and why: docs/SECURITY.md, "Several instances on one PostgreSQL database".
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg

from keysvc.db import activities as activity_sql
from keysvc.db import keys as key_sql
from keysvc.db.cache import Caches
from keysvc.db.contract import NO_RECORDS, Announce, Connection, Recheck, Records
from keysvc.db.core import StoreCore
from keysvc.db.front import CoreFront
from keysvc.db.keys import GRANTED_ROLES, over_limit
from keysvc.db.keystates import KeyStates
from keysvc.db.meta import GENERATION
from keysvc.db.outbox import enqueue
from keysvc.db.postgres import peers, sharedcounts
from keysvc.db.postgres import schema as pgschema
from keysvc.db.postgres.connection import (
    ACQUIRE_SECONDS,
    CONNECT_SECONDS,
    COUNT_SECONDS,
    READY_SECONDS,
    START_CONNECT_SECONDS,
    STATEMENT_SECONDS,
    UNAVAILABLE,
    Outage,
    PgConnection,
    acquired,
    keep_session,
    refusal,
)
from keysvc.db.postgres.notifications import (
    ACKNOWLEDGE_SECONDS,
    AUTH_CHANNEL,
    DATA_CHANNEL,
    Notifications,
)
from keysvc.db.postgres.reader import PgReader
from keysvc.db.postgres.replicas import RoutedReader
from keysvc.db.rows import role_from_row
from keysvc.db.statements import fetch_all, fetch_one, to_the_end
from keysvc.db.timing import Observer
from keysvc.models import Key, NewKey

logger = logging.getLogger("keysvc")

# What opening a store may raise for an unreachable or refused database.
CONNECT_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)
# The lock every write transaction holds: keysvc_locks' 'write' row, for update, which
# only keysvc's role may lock (pgschema.LOCKS_TABLE; an advisory lock's key any role
# that may CONNECT could hold).
# Quiet for the transaction as well as the session (``pgschema.QUIET``): a pooler's
# server connections carry no setting of keysvc's session.
# And ended by the server once it idles between statements longer than
# IDLE_IN_WRITE_SECONDS ($3, in ms): a writer that stopped talking inside it (a
# ``keysvc import`` paused with Ctrl-Z, a frozen instance, a client cut off) held the
# row, so every tenant's writes, for as long as it stayed stopped (rt63 F1). Rolled
# back, the row let go; the writer's next statement finds its session ended.
_WRITE_LOCK = (
    "select set_config('keysvc.token', $2, true), set_config('keysvc.quiet', 'on', true),"
    " set_config('idle_in_transaction_session_timeout', $3, true)"
    " from keysvc_locks where name = $1 for update"
)
# Between a write transaction's statements there is only this process's own work (an
# import batch's rows and activity: under a second for 20,000 keys): the bound is a
# statement's, and below the 15 s another write waits for the row (WRITE_SECONDS).
IDLE_IN_WRITE_SECONDS = STATEMENT_SECONDS
# The longest a write waits before its first statement is answered, the in-process lock
# included (docs/SECURITY.md's bounds): past it, a 503.
WRITE_SECONDS = ACQUIRE_SECONDS + STATEMENT_SECONDS
# How long closing waits for the writes under way, then for the pool's connections.
CLOSE_SECONDS = 10.0
_BUMP_GENERATION = (
    "update meta set value = (value::bigint + 1)::text where name = 'auth_generation'"
)
# A server that takes no writes: a standby, or default_transaction_read_only.
_READ_ONLY = "select pg_is_in_recovery() or current_setting('transaction_read_only') = 'on'"
# Set around a new key's inserts: its role rows do not move the generation.
_NEW_KEY = "select set_config('keysvc.new_key', ?, true)"


@dataclass(frozen=True)
class Replicas:
    """Where reads may go besides the primary (``keysvc.db.postgres.replicas``): hot
    standbys' URLs, the lag past which one is left out; and the listening connection's
    own URL, for a ``--db`` that goes through a pooler (None: ``--db``)."""

    urls: tuple[str, ...] = ()
    max_lag: float = 5.0
    listen_url: str | None = None

    @property
    def pooled(self) -> bool:
        """Whether ``--db`` goes through a pooler in transaction mode: a listening URL
        of its own says so. Its connections then carry no session setting and no
        prepared statement (the next transaction may run on another server
        connection), and the schema is migrated on the direct URL (the first
        migration's lock is a session's)."""
        return self.listen_url is not None


NO_REPLICAS = Replicas()


def _session(pooled: bool) -> dict[str, Any]:
    """The pool's session options: quiet (``pgschema.QUIET``) on direct connections;
    through a pooler none (PgBouncer refuses a startup parameter it does not know),
    and no statement kept prepared (asyncpg's cache: a statement prepared on one
    server connection is not on the next)."""
    if pooled:
        return {"statement_cache_size": 0}
    return {"server_settings": pgschema.QUIET}


def _left(deadline: float, most: float | None = None) -> float:
    """The time left until ``deadline`` (the loop's clock), at most ``most``."""
    left = max(deadline - asyncio.get_running_loop().time(), 0.001)
    return left if most is None else min(left, most)


class AlwaysRoom:
    """The disk-space watch SQLite needs (keysvc.db.sqlite.diskspace), which PostgreSQL's server
    does for itself: a refused write is an error like any other."""

    full = False

    def failed(self, exc: Exception) -> Exception:
        return exc

    def succeeded(self) -> None:
        return None

    def ready(self) -> bool:
        return True


class PgWriter:
    """Write transactions: each on a pooled connection, under _WRITE_LOCK."""

    def __init__(
        self,
        pool: Any,
        notifications: Notifications,
        on_authorization_changed: Callable[[], None],
        outage: Outage,
    ):
        self._pool = pool
        self._outage = outage
        self._notifications = notifications
        self._on_authorization_changed = on_authorization_changed
        self.space = AlwaysRoom()
        # Within the process too, one transaction at a time: waiting here costs no
        # pooled connection.
        self.lock = asyncio.Lock()
        self._authorization_changed = False

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[PgConnection]:
        """One write transaction, announced once committed (``_announce``). One that
        moved the generation returns once the other instances have heard of it or
        read it (``Notifications.seen_everywhere``), waited for after the lock is let
        go."""
        moved: int | None = None
        deadline = asyncio.get_running_loop().time() + WRITE_SECONDS
        try:
            async with (
                self._locked(deadline),
                acquired(self._pool, self._outage, _left(deadline, ACQUIRE_SECONDS)) as raw,
            ):
                self._authorization_changed = False
                committing = False
                try:
                    async with self._committed_to_the_end(raw):
                        # The tables' triggers announce this transaction's changes with
                        # the same token as the writer (keysvc_data_changed).
                        idle = str(int(IDLE_IN_WRITE_SECONDS * 1000))
                        await raw.execute(
                            _WRITE_LOCK, "write", self._notifications.token, idle,
                            timeout=_left(deadline),
                        )  # fmt: skip
                        yield PgConnection(raw)
                        if self._authorization_changed:
                            # The triggers may have moved it further than the domain's bump.
                            moved = int(await raw.fetchval(GENERATION))
                        committing = True
                except asyncpg.IntegrityConstraintViolationError as exc:
                    raise refusal(exc) from None
                except BaseException:
                    if committing:  # the commit failed, or did it? (is_own_commit)
                        self._notifications.committed()
                    raise
                self._committed()
                announced = await self._announce(raw, moved)
                # Listed after the commit: a listening connection made later reads a
                # generation at least as new when it starts.
                listeners: list[str] | None = []
                if moved is not None:
                    listeners = await self._listeners(raw) if announced else None
            if moved is not None and listeners is None:
                # Unannounced, or the instances not listed: answered once every other
                # instance has read the generation by polling (docs/SECURITY.md's bounds).
                await asyncio.sleep(ACKNOWLEDGE_SECONDS)
            elif moved is not None and listeners:
                await self._notifications.seen_everywhere(moved, listeners)
        except UNAVAILABLE as exc:
            raise self._outage.unavailable(exc) from None

    @asynccontextmanager
    async def _locked(self, deadline: float) -> AsyncIterator[None]:
        """``lock``, waited for until ``deadline`` at most (then TimeoutError: a 503)."""
        async with asyncio.timeout_at(deadline):
            await self.lock.acquire()
        try:
            yield
        finally:
            self.lock.release()

    async def _announce(self, raw: Any, moved: int | None) -> bool:
        """Tell the other instances of a commit, after it, in a statement of its own:
        a full NOTIFY queue (one per cluster, which any role that may log in anywhere
        on the server can fill) must not refuse keysvc's writes. Lost, the commit
        stands: the other instances read the generation at every probe, and theirs
        and this one's caches are cold while the queue is filling
        (``Notifications.deaf``). False when lost: a write that moved the generation
        then answers after ACKNOWLEDGE_SECONDS, by when every instance has polled it."""
        notifications = self._notifications
        token = notifications.token
        # With replicas, the position past this commit, read in the same statement.
        position = notifications.position_column
        version = notifications.version
        try:
            if moved is None:
                row = await raw.fetchrow("select pg_notify($1, $2)" + position, DATA_CHANNEL, token)
            else:
                row = await raw.fetchrow(
                    "select pg_notify($1, $2), pg_notify($3, $4)" + position,
                    DATA_CHANNEL, token, AUTH_CHANNEL, str(moved),
                )  # fmt: skip
        except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
            notifications.unannounced(exc)
            return False
        if position:
            notifications.located(row[-1], version)
        return True

    async def _listeners(self, raw: Any) -> list[str] | None:
        """The other instances listening now (``peers.LISTENING``); None when they
        cannot be listed (the write, committed already, then waits ACKNOWLEDGE_SECONDS)."""
        try:
            rows = await raw.fetch(peers.LISTENING, self._notifications.instance)
        except CONNECT_ERRORS as exc:
            logger.warning("could not list the other instances: %s", type(exc).__name__)
            return None
        return [str(row[0]) for row in rows]

    async def authorization_changed(self, conn: Connection) -> None:
        await conn.execute(_BUMP_GENERATION)
        self._authorization_changed = True

    # A transaction cancelled while its COMMIT is under way.

    @asynccontextmanager
    async def _committed_to_the_end(self, raw: Any) -> AsyncIterator[None]:
        """``raw.transaction()``, but a COMMIT once sent is awaited to its end even if
        the caller is cancelled meanwhile. Cancelled there, asyncpg would stop waiting
        for an answer the server may have given already: a transaction in the database
        that this process took for uncommitted, its caches left serving what it
        changed until the notification came back. Committed, the caches are told here
        and the cancellation is let through."""
        transaction = raw.transaction()
        await transaction.start()
        try:
            yield
        except (TimeoutError, asyncpg.InternalClientError):
            raise  # no rollback: the connection is terminated (``acquired``)
        except BaseException:
            await transaction.rollback()
            raise
        if await to_the_end(transaction.commit()):
            self._committed()
            raise asyncio.CancelledError

    def _committed(self) -> None:
        """What a commit tells this process's caches. One that moved the generation
        also stands for a new generation until its own announcement comes back: a read
        begun before the commit and ended after it must not keep what it read."""
        self._notifications.committed()
        if self._authorization_changed:
            self._notifications.generation = object()
            self._on_authorization_changed()


class PgStore(CoreFront):
    """The store on PostgreSQL (see the module), the SQLite store's sibling: what both
    answer alike is its ``StoreCore``'s, run on the pool (``reader``, ``points``),
    ``PgWriter`` and ``Notifications``."""

    def __init__(
        self,
        pool: Any,
        url: str,
        *,
        observer: Observer | None,
        cache_size: int,
        records: Records = NO_RECORDS,
        peer_key: bytes,
        replicas: Replicas = NO_REPLICAS,
        registered: bool = True,
    ):
        self._pool = pool
        self._records = records
        self.notifications = Notifications(
            replicas.listen_url or url,
            peer_key,
            track_position=bool(replicas.urls),
            registered=registered,
        )
        self._outage = Outage()
        # The primary's pool: the background tasks' reads, and every read without replicas.
        self.reader = PgReader(pool, self._outage)
        self.routed: RoutedReader | None = None
        reads: PgReader | RoutedReader = self.reader
        if replicas.urls:
            reads = self.routed = RoutedReader(
                self.reader, pool, replicas.urls, replicas.max_lag,
                self.notifications.known_position, replicas.pooled,
            )  # fmt: skip
        # The point reads (get_key, find_credential) run on the pool as well.
        self.points = reads
        self.caches = Caches(self.notifications, cache_size)
        self.writer = PgWriter(
            pool, self.notifications, self.caches.authorization_changed, self._outage
        )
        self.observer = observer
        core = self._core = StoreCore(reads, reads, self.writer, self.caches, observer, records)
        self._front(core)

    @classmethod
    async def open_url(
        cls,
        url: str,
        *,
        observer: Observer | None = None,
        cache_size: int = 10_000,
        create: bool = True,
        records: Records = NO_RECORDS,
        peer_key: bytes,
        replicas: Replicas = NO_REPLICAS,
        registered: bool = True,
    ) -> "PgStore":
        """``peer_key``: what the instances sign their acknowledgements with, derived
        from the pepper they share (``keysvc.credentials.PEER_ACKNOWLEDGEMENTS``);
        ``replicas``: the hot standbys that may answer reads, and the listening
        connection's own URL (``Replicas``); ``registered``: an instance that writers
        wait for, a served one (``Notifications``)."""
        # Migrated on a connection of its own: a step may take longer than a statement's
        # bound on the pool.
        direct = replicas.listen_url or url
        try:
            conn = await asyncpg.connect(
                direct, timeout=START_CONNECT_SECONDS, server_settings=pgschema.QUIET
            )
        except TimeoutError:
            # Its own text is empty (rt63 F3): say what happened.
            raise TimeoutError(f"no answer within {START_CONNECT_SECONDS:g} s") from None
        try:
            await pgschema.migrate(conn, create=create)
        finally:
            conn.terminate()  # nothing to wait for: its transaction has ended
        pool = await asyncpg.create_pool(
            url,
            min_size=1,
            max_size=10,
            reset=keep_session,
            timeout=CONNECT_SECONDS,
            command_timeout=STATEMENT_SECONDS,
            **_session(replicas.pooled),
        )
        store: PgStore | None = None
        try:
            store = cls(
                pool,
                url,
                observer=observer,
                cache_size=cache_size,
                records=records,
                peer_key=peer_key,
                replicas=replicas,
                registered=registered,
            )
            await store.notifications.start()
            if store.routed is not None:
                await store.routed.start()
        except BaseException:
            if store is not None and store.routed is not None:
                await store.routed.close()
            await pool.close()
            raise
        return store

    async def close(self) -> None:
        try:
            async with asyncio.timeout(CLOSE_SECONDS):
                await self._core.finish_writes()
        except TimeoutError:
            logger.warning("PostgreSQL writes still under way at close; left unfinished")
        await self.notifications.close()
        if self.routed is not None:
            await self.routed.close()
        # The pool waits for every connection to be given back; one that never is (a
        # server that stopped answering) must not keep a stopping process for ever.
        try:
            async with asyncio.timeout(CLOSE_SECONDS):
                await self._pool.close()
        except TimeoutError:
            logger.warning("PostgreSQL connections still busy at close; closed by force")
            self._pool.terminate()

    def key_counts(self, every: timedelta, observer: Observer | None) -> KeyStates:
        """Counted on the pool: the server is not this process's."""
        counter = PgReader(self._pool, self._outage, timeout=COUNT_SECONDS)
        return KeyStates(None, every=every, observer=observer, reader=counter)

    @asynccontextmanager
    async def delivery_reader(self) -> AsyncIterator[Connection]:
        """The pool: the server keeps reads from waiting on writes."""
        yield self.reader

    def shared_counts(self) -> "PgStore":
        return self

    async def check_writable(self) -> None:
        """Fail now if this role cannot write keysvc's tables; nothing is kept."""
        async with acquired(self._pool, self._outage) as raw:
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
        """As ``Store.schema_is_current``: a database that does not answer within
        READY_SECONDS, the pooled connection's wait included, or that is read-only (a
        standby, default_transaction_read_only) raises DatabaseUnavailable."""
        # Each part bounded by what is left, the statements' inside ``acquired``: a
        # timed-out connection is terminated there, not given back to wait on.
        deadline = asyncio.get_running_loop().time() + READY_SECONDS
        try:
            async with (
                acquired(self._pool, self._outage, READY_SECONDS) as raw,
                asyncio.timeout_at(deadline),
            ):
                if await raw.fetchval(_READ_ONLY):
                    raise asyncpg.ReadOnlySQLTransactionError("the server is read-only")
                return await pgschema.schema_is_current(raw)
        except CONNECT_ERRORS as exc:
            raise self._outage.unavailable(exc) from None

    async def create_key(
        self, new: NewKey, max_keys: int, announce: Announce, recheck: Recheck | None = None
    ) -> Key:
        """One transaction: the key cap counted and the domain's rule run again under
        the write lock, the key and its roles inserted, its activity and its
        key.created event written. Its key_roles rows leave the generation where it
        is (``keysvc.new_key``, which the schema's trigger reads): no cache can hold a
        key not yet committed, and the generation only moves forward, as the other
        instances' acknowledgements of it need (``Notifications.seen_everywhere``)."""
        key_event = self._records.key_event_of()
        async with self.transaction("create_key") as conn:
            org = new.organization_id
            counted = await fetch_one(conn, key_sql.COUNT_KEYS, (org,))
            if counted is not None and counted[0] >= max_keys:
                raise over_limit(max_keys)
            if recheck is not None:
                ids = list(dict.fromkeys(new.role_ids))
                rows = await fetch_all(conn, GRANTED_ROLES, (json.dumps(ids),))
                refused = recheck(new, {row["id"]: role_from_row(row) for row in rows})
                if refused is not None:
                    raise refused
            await conn.execute(_NEW_KEY, ("on",))
            key = await key_sql.insert_key(conn, new)
            await conn.execute(_NEW_KEY, ("",))
            await activity_sql.record(conn, self.chain, announce(key))
            await enqueue(
                conn, self.seal, self._core.quota, org, "key.created", key_event(key),
                key.created_at,
            )  # fmt: skip
            return key

    # The counts the instances share (keysvc.domain.sharedlimits): one statement each, on a
    # pooled connection, committed alone, outside _WRITE_LOCK: they check no rule of
    # the domain's and must not wait behind its transactions.

    async def add_shared_counts(self, rows: list[sharedcounts.Added]) -> dict[tuple[str, int], int]:
        async with acquired(self._pool, self._outage) as raw:
            return await sharedcounts.add(PgConnection(raw), rows)

    async def prune_shared_counts(self, now: float) -> None:
        async with acquired(self._pool, self._outage) as raw:
            await sharedcounts.prune(PgConnection(raw), now)

    async def blocked_networks(self, start: int, limit: int, most: int) -> dict[str, int]:
        async with acquired(self._pool, self._outage) as raw:
            return await sharedcounts.blocked(PgConnection(raw), start, limit, most)
