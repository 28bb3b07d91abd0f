"""All SQL about keys, as plain text with ``?`` parameters, behind a thin async store.

Connections: one writer, guarded by a lock so that each write runs in its own
``BEGIN IMMEDIATE`` transaction; one reader, which in WAL mode sees only
committed data; and one synchronous "watcher" used on the event loop for a
single cheap question: has anything been committed since I last looked
(``PRAGMA data_version``, which moves on any other connection's commit, in
this process or another).

Credentials are cached (``keysvc.cache``). Every write that can change an
authentication or authorization answer bumps ``auth_generation`` in the same
transaction, and so do schema.sql's triggers for any change to keys, their roles
and roles, an operator's by hand included; the watcher sees the commit, reads
the generation, and drops the cache before the next request is answered, in
every process. ``usedAt`` writes move ``data_version`` but not the generation,
so they do not flush it.

Concurrent creates are grouped: one transaction, one fsync, for all the
creates waiting. Should one be refused, the batch starts again a key at a
time, each in its own savepoint, so that it fails only its own request; each
request is answered only after that commit.

The store returns dataclasses, never cursors, and knows nothing of HTTP
beyond raising keysvc's own errors. Lists of IDs are passed as one JSON
parameter and expanded with ``json_each``, so no SQL is ever built.
"""

import asyncio
import functools
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import aiosqlite

from keysvc import db
from keysvc.cache import CredentialCache, VersionedCache
from keysvc.config import ConfigError, Settings
from keysvc.credentials import Hasher, load_pepper
from keysvc.diskspace import DiskSpace
from keysvc.errors import (
    Conflict,
    Forbidden,
    InsufficientStorage,
    PreconditionFailed,
    ServiceUnavailable,
)
from keysvc.models import Credential, Key, KeyChange, KeyPage, NewKey, Organization, Role
from keysvc.permissions import cannot_grant
from keysvc.timeutil import from_text, to_text
from keysvc.walwatch import CommitWatch

_KEY_BY_ID = """
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window
    from api_keys where id = ? and organization_id = ?
"""
_KEY_PAGE = """
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window
    from api_keys where organization_id = ? and org_seq > ? order by org_seq limit ?
"""
_CREDENTIAL = """
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window, secret_hash
    from api_keys where key_id_hash = ?
"""
_CREDENTIAL_BY_ID = """
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window, secret_hash
    from api_keys where id = ? and organization_id = ?
"""
_ROLES_OF_KEYS = """
    select kr.key_id, r.id, r.name, r.type, r.permissions, r.created_at, r.updated_at
    from key_roles kr join roles r on r.id = kr.role_id
    where kr.key_id in (select value from json_each(?))
    order by r.type = 'custom', r.name
"""
_KEYS_WITH_IDS = """
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window
    from api_keys where id in (select value from json_each(?)) order by seq
"""
_INSERT_KEY = """
    insert into api_keys (id, org_seq, organization_id, name, state, key_id_hash, secret_hash,
                          key_suffix, ip_access_list, created_at, expire_at, rate_limit,
                          rate_window)
    values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
_INSERT_KEY_ROLE = "insert into key_roles (key_id, role_id) values (?, ?)"
# Heads of _insert_rows's statements, and its rows per statement (13 parameters a key
# row; SQLite takes up to 32,766 parameters).
_INSERT_KEYS = _INSERT_KEY[: _INSERT_KEY.index("values")] + "values "
_INSERT_KEY_ROLES = "insert into key_roles (key_id, role_id) values "
ROWS_PER_INSERT = 500
# The roles a batch of creates assigns, as they are inside its transaction.
_GRANTED_ROLES = """
    select id, name, type, permissions, created_at, updated_at from roles
    where id in (select value from json_each(?))
"""
_COUNT_KEYS_OF = """
    select id, key_count, last_key_seq from organizations
    where id in (select value from json_each(?))
"""
_GENERATION = "select value from meta where name = 'auth_generation'"
_SET_GENERATION = "update meta set value = ? where name = 'auth_generation'"
_COUNT_KEYS = "select key_count from organizations where id = ?"
_LAST_KEY_SEQ = "select last_key_seq from organizations where id = ?"
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

# Rendered list pages kept (each up to the page limit of keys, ~0.4 KiB a key).
PAGE_CACHE_ENTRIES = 32

# Told the name and duration in seconds of every store call, for metrics.
Observer = Callable[[str, float], None]
_P = ParamSpec("_P")
_T = TypeVar("_T")


class _Observed(Protocol):
    observer: Observer | None


_O = TypeVar("_O", bound=_Observed)


def timed(
    method: Callable[Concatenate[_O, _P], Awaitable[_T]],
) -> Callable[Concatenate[_O, _P], Awaitable[_T]]:
    """Report the call's duration, waiting for the write lock included, to the observer."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: _O, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        observer = self.observer
        if observer is None:
            return await method(self, *args, **kwargs)
        started = time.perf_counter()
        try:
            return await method(self, *args, **kwargs)
        finally:
            observer(name, time.perf_counter() - started)

    return wrapper


@dataclass
class _PendingCreate:
    new: NewKey
    max_keys: int
    done: "asyncio.Future[Key]" = field(repr=False)


@dataclass
class _PendingTouches:
    """usedAt writes waiting for the next transaction (key UUID -> minute), and the
    future that every request waiting on one of them shares."""

    minutes: dict[str, str]
    done: "asyncio.Future[None]" = field(repr=False)


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
        self._writer = writer
        self.reader = reader
        self._watcher = watcher
        self._commits = CommitWatch(watcher, path)
        self._creates = _CreateThread(path)
        self._write_lock = asyncio.Lock()
        # Whether writes find the disk full (keysvc.diskspace), for every write path.
        self.space = DiskSpace(path)
        self.observer = observer
        self._cache = CredentialCache(cache_size)
        # Rendered answers that depend only on committed data (see data_version).
        self.pages: VersionedCache[tuple[object, ...], tuple[bytes, bytes]] = VersionedCache(
            PAGE_CACHE_ENTRIES if cache_size > 0 else 0
        )
        # Set by authorization_changed inside the running transaction (writes are serial).
        self._authorization_changed = False
        self._seen_version = -1
        self._seen_generation: object = None
        self._pending: list[_PendingCreate] = []
        # Keys whose usedAt this process has written for the minute in _touched_minute.
        self._touched: set[str] = set()
        self._touched_minute: datetime | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._touches: _PendingTouches | None = None
        self._touch_flusher: asyncio.Task[None] | None = None
        # Imported here: rolestore builds on this module's helpers.
        from keysvc.rolestore import RoleStore

        self.roles = RoleStore(self)

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        observer: Observer | None = None,
        cache_size: int = 10_000,
        create: bool = True,
    ) -> "Store":
        writer = await db.connect(path, create=create)
        try:
            await db.migrate(writer, create=create)
            reader = await db.connect(path)
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
        flushers = [task for task in (self._flusher, self._touch_flusher) if task is not None]
        await asyncio.gather(*flushers, return_exceptions=True)
        self._watcher.close()
        await self.reader.close()
        await self._writer.close()
        await self._creates.close()
        self._commits.close()  # last: closing it sooner would drop SQLite's locks (walwatch)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """One write transaction; holds the process's write lock throughout.

        If the transaction said ``authorization_changed``, this process's cache
        is dropped once it has committed; other processes see the generation move.
        """
        async with self._write_lock:
            self._authorization_changed = False
            try:
                await self._writer.execute("begin immediate")
                try:
                    yield self._writer
                    await self._writer.execute("commit")
                except BaseException:
                    # SQLite may have rolled back already (a full disk does).
                    if self._writer.in_transaction:
                        await self._writer.execute("rollback")
                    raise
            except sqlite3.Error as exc:
                failure = self.space.failed(exc)
                if failure is exc:
                    raise
                raise failure from None
            self.space.succeeded()
            if self._authorization_changed:
                self._cache.clear()

    async def authorization_changed(self, conn: aiosqlite.Connection) -> None:
        """Inside a transaction: what some key may do has changed. Bumps the generation."""
        await conn.execute(
            "update meta set value = cast(value as integer) + 1 where name = 'auth_generation'"
        )
        self._authorization_changed = True

    def _fresh(self) -> int:
        """Drop the cache if authorization may have changed since; return data_version.

        Runs on the event loop without a thread hop or a statement while nothing
        has been committed (``keysvc.walwatch``); the generation is read only when
        some connection has committed since the last look.
        """
        version = self._commits.version()
        if version != self._seen_version:
            row = self._watcher.execute(_GENERATION).fetchone()
            generation = row[0] if row else None
            if generation != self._seen_generation:
                self._cache.clear()
                self._seen_generation = generation
            self._seen_version = version
        return version

    def _unchanged_since(self, generation: object) -> bool:
        """Whether authorization is still at ``generation``, as seen before some reads
        that awaited: only then may what they read be cached. A commit meanwhile (here
        or in another process) may have dropped the cache already, and a record read
        before it would otherwise be kept, and trusted, until the next such commit."""
        self._fresh()
        return self._seen_generation == generation

    def data_version(self) -> int:
        """A number that changes whenever anything is committed, by any connection in
        any process: what was read at one value is still current while it holds."""
        return self._fresh()

    @timed
    async def recorded_pepper(self) -> str | None:
        """The fingerprint of the pepper this database was made with; None when new."""
        row = await _one(self.reader, "select value from meta where name = 'pepper'", ())
        return None if row is None else str(row["value"])

    @timed
    async def check_writable(self) -> None:
        """Fail now (sqlite3.OperationalError) if this process cannot write the
        database, rather than at a client's first write. Nothing is kept."""
        async with self._write_lock:
            await self._writer.execute("begin immediate")
            try:
                await self._writer.execute(
                    "insert or replace into meta (name, value) values ('write check', '')"
                )
            finally:
                await self._writer.execute("rollback")

    @timed
    async def check_pepper(self, fingerprint: str) -> None:
        """Record the pepper's fingerprint on first start; refuse a different pepper later."""
        async with self.transaction() as conn:
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

    @timed
    async def schema_is_current(self) -> bool:
        """True when the database answers and its schema is the one this code expects."""
        row = await _one(self.reader, "pragma user_version", ())
        return row is not None and row[0] == db.schema_version()

    @timed
    async def has_organization(self) -> bool:
        return await _one(self.reader, "select 1 from organizations limit 1", ()) is not None

    @timed
    async def organization_ids(self) -> list[str]:
        """Every organization's ID, oldest first."""
        rows = await _all(self.reader, "select id from organizations order by created_at, id", ())
        return [str(row["id"]) for row in rows]

    @timed
    async def bootstrap(self, org_name: str, new: NewKey) -> tuple[Organization, Key]:
        """Create an organization and its first key in one transaction."""
        org = Organization(id=str(uuid.uuid4()), name=org_name, created_at=new.created_at)
        async with self.transaction() as conn:
            await conn.execute(
                "insert into organizations (id, name, created_at) values (?, ?, ?)",
                (org.id, org.name, to_text(org.created_at)),
            )
            key = await _insert_key(conn, replace(new, organization_id=org.id))
        return org, key

    # Keys

    @timed
    async def create_key(self, new: NewKey, max_keys: int) -> Key:
        """Store a key; answered only once the transaction holding it has committed."""
        pending = _PendingCreate(new, max_keys, asyncio.get_running_loop().create_future())
        self._pending.append(pending)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_creates())
        return await asyncio.shield(pending.done)

    async def _flush_creates(self) -> None:
        while self._pending:
            # Creates that arrive while a write holds the lock pile up for the next batch.
            async with self._write_lock:
                batch, self._pending = self._pending, []
                await self._create_batch(batch)

    async def _create_batch(self, batch: list[_PendingCreate]) -> None:
        """One transaction for the whole batch (``_CreateThread``); each request is
        answered once it has committed."""
        work = [(item.new, item.max_keys) for item in batch]
        running = asyncio.ensure_future(self._creates.run(work))
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            # The batch runs to its end (shielded); its requests still get their answers.
            running.add_done_callback(lambda done: _settle(batch, done, self.space))
            raise
        except Exception:  # noqa: S110 - the failure is each request's answer, see _settle
            pass
        _settle(batch, running, self.space)

    def cached_key(self, organization_id: str, key_id: str) -> Key | None:
        """The key as committed now, if it is cached and nothing at all was committed
        since it was read; no statement runs (``get_key`` reads on a miss)."""
        version = self._fresh()
        entry = self._cache.by_key(key_id)
        if (
            entry is not None
            and entry.data_version == version
            and entry.credential.key.organization_id == organization_id
        ):
            return entry.credential.key
        return None

    @timed
    async def get_key(self, organization_id: str, key_id: str) -> Key | None:
        """The key as committed now: from the cache only if nothing was committed since."""
        cached = self.cached_key(organization_id, key_id)
        if cached is not None:
            return cached
        version = self._fresh()  # read before the row, so a later commit is not hidden
        generation = self._seen_generation
        row = await _one(self.reader, _CREDENTIAL_BY_ID, (key_id, organization_id))
        if row is None:
            return None
        (key,) = await _keys_from_rows(self.reader, [row])
        if self._unchanged_since(generation):
            self._cache.refresh(Credential(key, row["secret_hash"]), version)
        return key

    @timed
    async def list_keys(self, organization_id: str, after: int, limit: int) -> KeyPage:
        """Keys oldest first, after the organization's ``after``-th key (``Key.org_seq``):
        a keyset page, as cheap at page N as page 1."""
        rows = await _all(self.reader, _KEY_PAGE, (organization_id, after, limit + 1))
        keys = await _keys_from_rows(self.reader, rows[:limit])
        total = await _one(self.reader, _COUNT_KEYS, (organization_id,))
        return KeyPage(keys=keys, more=len(rows) > limit, total=total[0] if total else 0)

    @timed
    async def update_key(
        self,
        organization_id: str,
        key_id: str,
        change: KeyChange,
        if_match: Collection[str] | None = None,
        check: Callable[[Key], None] | None = None,
    ) -> Key | None:
        """Apply ``change``; with ``if_match``, only if the key's ETag is among them.
        ``check`` sees the key inside the transaction as it is, then as changed (so roles
        widened by another write since they were checked are caught), and may refuse by
        raising: the transaction is then rolled back."""
        async with self.transaction() as conn:
            current = await _get_key(conn, organization_id, key_id)
            if current is None:
                return None
            if check is not None:
                check(current)
            _check_if_match(current, if_match)
            expire_at = None if change.clear_expiry else change.expire_at or current.expire_at
            rate = None if change.clear_rate_limit else change.rate_limit or current.rate_limit
            ip_list = (
                current.ip_access_list if change.ip_access_list is None else change.ip_access_list
            )
            await conn.execute(
                "update api_keys set name = ?, state = ?, expire_at = ?, ip_access_list = ?,"
                " rate_limit = ?, rate_window = ? where id = ?",
                (
                    change.name or current.name,
                    change.state or current.state,
                    to_text(expire_at) if expire_at else None,
                    json.dumps(ip_list),
                    rate[0] if rate else None,
                    rate[1] if rate else None,
                    key_id,
                ),
            )
            if change.role_ids is not None:
                await conn.execute("delete from key_roles where key_id = ?", (key_id,))
                await _insert_key_roles(conn, key_id, change.role_ids)
            await self.authorization_changed(conn)
            changed = await _get_key(conn, organization_id, key_id)
            if check is not None and changed is not None:
                check(changed)
            return changed

    @timed
    async def delete_key(
        self,
        organization_id: str,
        key_id: str,
        check: Callable[[Key], None] | None = None,
        if_match: Collection[str] | None = None,
    ) -> bool:
        """Delete the key; False if there is none. ``check`` and ``if_match`` as for
        ``update_key``: both are decided inside the delete's transaction."""
        async with self.transaction() as conn:
            if check is not None or if_match is not None:
                current = await _get_key(conn, organization_id, key_id)
                if current is None:
                    return False
                if check is not None:
                    check(current)
                _check_if_match(current, if_match)
            cursor = await conn.execute(
                "delete from api_keys where id = ? and organization_id = ?",
                (key_id, organization_id),
            )
            deleted = cursor.rowcount > 0
            if deleted:
                await self.authorization_changed(conn)
        return deleted

    def cached_credential(self, key_id_hash: bytes) -> Credential | None:
        """The credential, if it is cached and authorization has not moved since; no
        statement runs (``find_credential`` reads the database on a miss)."""
        self._fresh()
        entry = self._cache.get(key_id_hash)
        return entry.credential if entry is not None else None

    def proven_credential(self, proof: bytes) -> Credential | None:
        """The credential a checked Authorization header carries, found by the header's
        keyed hash (``CredentialCache.proven``), if authorization has not moved since."""
        self._fresh()
        return self._cache.proven(proof)

    def remember_proof(self, proof: bytes, key_id_hash: bytes, credential: Credential) -> None:
        """Remember that the header hashed to ``proof`` carries ``credential``'s
        key ID (hashed to ``key_id_hash``) and its secret."""
        self._cache.prove(proof, key_id_hash, credential)

    async def find_credential(self, key_id_hash: bytes) -> Credential | None:
        """The credential for a keyed key-ID hash: cached, unless authorization moved since."""
        version = self._fresh()
        generation = self._seen_generation
        entry = self._cache.get(key_id_hash)
        if entry is not None:
            return entry.credential
        row = await _one(self.reader, _CREDENTIAL, (key_id_hash,))
        if row is None:
            return None
        (key,) = await _keys_from_rows(self.reader, [row])
        credential = Credential(key=key, secret_hash=row["secret_hash"])
        if self._unchanged_since(generation):
            self._cache.put(key_id_hash, credential, version)
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
            await _one(self.reader, _CREDENTIAL, (key_id_hash,))
        if done < 2:
            # An unknown ID's roles are those of no key: the same query, finding none.
            key_ids = [found.key.id if found is not None else str(uuid.uuid4())]
            await _all(self.reader, _ROLES_OF_KEYS, (json.dumps(key_ids),))

    def needs_touch(self, key: Key, minute: datetime) -> bool:
        """Whether ``key``'s usedAt is behind ``minute``, as far as this process knows.

        A cached record keeps the usedAt it was read with, so the keys written
        this minute are remembered here; the set starts again each minute.
        """
        if key.used_at is not None and key.used_at >= minute:
            return False
        return minute != self._touched_minute or key.id not in self._touched

    @timed
    async def touch_used(self, key_id: str, minute: datetime) -> None:
        """Set usedAt to ``minute`` unless it is already there (at most one write a minute).

        Answered once committed. Touches that arrive together share one transaction
        (and one fsync): at the turn of a minute every busy key writes at once. On a
        full disk it is answered unwritten, and a later request tries again.
        """
        if minute != self._touched_minute:
            self._touched, self._touched_minute = set(), minute
        self._touched.add(key_id)
        touches = self._touches
        if touches is None:
            touches = self._touches = _PendingTouches(
                {}, asyncio.get_running_loop().create_future()
            )
        touches.minutes[key_id] = to_text(minute)
        if self._touch_flusher is None or self._touch_flusher.done():
            self._touch_flusher = asyncio.create_task(self._flush_touches())
        try:
            await asyncio.shield(touches.done)
        except InsufficientStorage:
            # usedAt is not worth refusing a request for: it is written by a later one.
            self._touched.discard(key_id)

    async def _flush_touches(self) -> None:
        while self._touches is not None:
            touches = None
            try:
                async with self.transaction() as conn:
                    # Taken once the lock is held: touches that came meanwhile join in.
                    touches, self._touches = self._touches, None
                    if touches is None:
                        return
                    await conn.executemany(
                        "update api_keys set used_at = ?"
                        " where id = ? and (used_at is null or used_at < ?)",
                        [(text, key_id, text) for key_id, text in touches.minutes.items()],
                    )
            except Exception as exc:
                if touches is None:  # failed before taking them: they fail all the same
                    touches, self._touches = self._touches, None
                if touches is not None and not touches.done.done():
                    touches.done.set_exception(exc)
                    touches.done.exception()  # retrieved, should every waiter be gone
                continue
            except BaseException:
                # Cancelled: the waiters must not hang on a future nobody will settle.
                pending = [t for t in (touches, self._touches) if t is not None]
                self._touches = None
                for waiting in pending:
                    if not waiting.done.done():
                        waiting.done.cancel()
                raise
            touches.done.set_result(None)


def count_keys_by_state(conn: sqlite3.Connection, now: datetime) -> dict[str, int]:
    """Keys of all organizations by effective state: enabled, disabled, expired.

    A scan of every key: run it on a connection of its own, never on the Store's
    reader, which authentication waits on (``keysvc.keystates`` does).
    """
    counts = {"enabled": 0, "disabled": 0, "expired": 0}
    for row in conn.execute(_COUNT_KEYS_BY_STATE, (to_text(now),)).fetchall():
        counts[row["effective"]] = row["n"]
    return counts


# One trip to the connection's thread each (execute, fetch and close together), where
# a cursor would take three: each trip is a queue hand-over and a wake-up of the loop.
async def _one(
    conn: aiosqlite.Connection, sql: str, params: Sequence[object]
) -> sqlite3.Row | None:
    rows = await conn.execute_fetchall(sql, params)
    return next(iter(rows), None)


async def _all(conn: aiosqlite.Connection, sql: str, params: Sequence[object]) -> list[sqlite3.Row]:
    return list(await conn.execute_fetchall(sql, params))


_ROLE_COLUMNS = ("id", "name", "type", "permissions", "created_at", "updated_at")
_KEY_COLUMNS = (
    "seq", "org_seq", "id", "organization_id", "name", "state", "key_suffix", "created_at",
    "expire_at", "used_at", "ip_access_list", "rate_limit", "rate_window",
)  # fmt: skip
# Records made from rows, by the rows' values: a row read again unchanged gives back
# the object made before (with the JSON text views keep on it) rather than a new one.
# A list page read again after one key's usedAt moved rebuilds only that key. Records
# are immutable, so sharing them is safe; each table is emptied whole when full.
MADE_MAX = 4096
_roles_made: dict[tuple[object, ...], Role] = {}
_keys_made: dict[tuple[object, ...], Key] = {}


def _made(
    table: dict[tuple[object, ...], _T], values: tuple[object, ...], make: Callable[[], _T]
) -> _T:
    """The record made before from ``values``, else ``make()``'s, kept in ``table``."""
    made = table.get(values)
    if made is None:
        made = make()
        if len(table) >= MADE_MAX:
            table.clear()
        table[values] = made
    return made


def _role(row: sqlite3.Row) -> Role:
    return _made(
        _roles_made,
        tuple(row[name] for name in _ROLE_COLUMNS),
        lambda: Role(
            id=row["id"],
            name=row["name"],
            type=row["type"],
            permissions=tuple(json.loads(row["permissions"])),
            created_at=from_text(row["created_at"]),
            updated_at=from_text(row["updated_at"]),
        ),
    )


def _key(row: sqlite3.Row, roles: Sequence[Role]) -> Key:
    return _made(
        _keys_made,
        (*(row[name] for name in _KEY_COLUMNS), *roles),  # Role: frozen, hashable
        lambda: Key(
            id=row["id"],
            seq=row["seq"],
            org_seq=row["org_seq"],
            organization_id=row["organization_id"],
            name=row["name"],
            state=row["state"],
            key_suffix=row["key_suffix"],
            created_at=from_text(row["created_at"]),
            expire_at=from_text(row["expire_at"]) if row["expire_at"] else None,
            used_at=from_text(row["used_at"]) if row["used_at"] else None,
            ip_access_list=json.loads(row["ip_access_list"]),
            roles=tuple(roles),
            rate_limit=(row["rate_limit"], row["rate_window"]) if row["rate_limit"] else None,
        ),
    )


def _with_roles(rows: Sequence[sqlite3.Row], role_rows: Sequence[sqlite3.Row]) -> list[Key]:
    """Keys from their rows, and their roles from _ROLES_OF_KEYS rows."""
    roles: dict[str, list[Role]] = {row["id"]: [] for row in rows}
    for role_row in role_rows:
        roles[role_row["key_id"]].append(_role(role_row))
    return [_key(row, roles[row["id"]]) for row in rows]


async def _keys_from_rows(conn: aiosqlite.Connection, rows: Sequence[sqlite3.Row]) -> list[Key]:
    """Keys with their roles, read with one query for the whole batch."""
    if not rows:
        return []
    ids = json.dumps([row["id"] for row in rows])
    return _with_roles(rows, await _all(conn, _ROLES_OF_KEYS, (ids,)))


async def _get_key(conn: aiosqlite.Connection, organization_id: str, key_id: str) -> Key | None:
    row = await _one(conn, _KEY_BY_ID, (key_id, organization_id))
    return None if row is None else (await _keys_from_rows(conn, [row]))[0]


def _check_if_match(key: Key, if_match: Collection[str] | None) -> None:
    """Refuse (412) unless If-Match is absent, ``*`` (any existing key: RFC 9110,
    section 13.1.1) or names the key's current ETag."""
    if if_match is not None and "*" not in if_match and key.etag not in if_match:
        raise PreconditionFailed()


# What a create or an update is told when a constraint refuses its key, by either path.
_KEY_ID_TAKEN = "hashData.keyIdHash: a key with this key ID already exists"
_ROLE_GONE = "a role was deleted while this request ran; try again"


async def _insert_key_roles(
    conn: aiosqlite.Connection, key_id: str, role_ids: Sequence[str]
) -> None:
    try:
        await conn.executemany(
            _INSERT_KEY_ROLE, [(key_id, role_id) for role_id in dict.fromkeys(role_ids)]
        )
    except sqlite3.IntegrityError:
        raise Conflict(_ROLE_GONE) from None


def _key_row(key_id: str, org_seq: int, new: NewKey) -> tuple[object, ...]:
    return (
        key_id,
        org_seq,
        new.organization_id,
        new.name,
        new.state,
        new.key_id_hash,
        new.secret_hash,
        new.key_suffix,
        json.dumps(new.ip_access_list),
        to_text(new.created_at),
        to_text(new.expire_at) if new.expire_at else None,
        new.rate_limit[0] if new.rate_limit else None,
        new.rate_limit[1] if new.rate_limit else None,
    )


async def _insert_key(conn: aiosqlite.Connection, new: NewKey) -> Key:
    key_id = str(uuid.uuid4())
    last = await _one(conn, _LAST_KEY_SEQ, (new.organization_id,))
    org_seq = (last[0] if last else 0) + 1
    try:
        await conn.execute(_INSERT_KEY, _key_row(key_id, org_seq, new))
    except sqlite3.IntegrityError as exc:
        if "key_id_hash" in str(exc):
            raise Conflict(_KEY_ID_TAKEN) from None
        raise
    await _insert_key_roles(conn, key_id, new.role_ids)
    key = await _get_key(conn, new.organization_id, key_id)
    assert key is not None
    return key


def _over_limit(max_keys: int) -> Conflict:
    return Conflict(f"this organization has reached its limit of {max_keys} keys")


def _settle(
    batch: Sequence[_PendingCreate], done: "asyncio.Future[list[_Made]]", space: DiskSpace
) -> None:
    """Answer each request of a finished batch: its key, or why it failed (a full
    disk as ``space`` says, once for the batch)."""
    if done.cancelled() or done.exception() is not None:
        failure = done.exception() if not done.cancelled() else None
        cause = space.failed(failure) if isinstance(failure, Exception) else None
        outcomes: list[_Made] = [(None, cause or RuntimeError("create cancelled"))] * len(batch)
    else:
        space.succeeded()
        outcomes = done.result()
    for item, (key, error) in zip(batch, outcomes, strict=True):
        if item.done.done():
            continue
        if error is not None:
            item.done.set_exception(error)
        elif key is not None:
            item.done.set_result(key)


# A created key, or why it was not created.
_Made = tuple[Key | None, Exception | None]


class _CreateThread:
    """The connection that writes create batches, and the thread that begins and
    commits them.

    A batch is a handful of statements. Run through aiosqlite, each was a hand-over
    to its thread and back, and under load every hand-back waited for a busy loop
    (``make bench`` measured 6 ms a batch, 16 keys, 1.5 ms of it the commit). Run
    whole on a thread of its own, the thread's Python (the rows, the keys read
    back) and the loop's took turns with the GIL dozens of times a batch. Now only
    what waits on the database file goes to the thread: the commit (its fsync),
    and ``begin immediate`` when another process holds the write lock (the loop
    tries it first without waiting: within the process the store's write lock,
    held around a batch as around every write transaction, leaves nobody to wait
    for). The statements between run on the loop, and so does the whole batch but
    its commit. The connection is used by one thread at a time: a batch holds
    ``_using`` from its begin to the end of its commit, even if it is cancelled
    meanwhile (``_on_thread``), and ``close`` takes it too.
    """

    def __init__(self, path: Path):
        self._path = path
        self._conn: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keysvc-creates")
        self._closed = False
        self._using = asyncio.Lock()

    async def open(self) -> None:
        """Connect now, in the thread, so that a database it cannot open fails the start."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._connect)

    def _connect(self) -> sqlite3.Connection:
        if self._closed and self._conn is None:
            # Never again once closed: an unclosed connection would outlive walwatch's hold.
            raise ServiceUnavailable("the database is closed: the server is stopping")
        if self._conn is None:
            # Used by the loop and by the thread in turn, never at once (see the class).
            self._conn = db.connect_now(self._path, shared=True)
        return self._conn

    async def run(self, batch: list[tuple[NewKey, int]]) -> list[_Made]:
        async with self._using:
            if self._closed:  # before, or while this batch waited for the one before it
                raise ServiceUnavailable("the database is closed: the server is stopping")
            conn = self._conn
            if conn is not None and conn.in_transaction:
                conn.execute("rollback")  # left open by a batch cancelled during its begin
            if conn is None or not _begin_now(conn):
                conn = await self._on_thread(_begin, self)
            try:
                outcomes = _stage_batch(conn, batch)
            except Exception:
                if conn.in_transaction:  # SQLite may have rolled back already (a full disk)
                    conn.execute("rollback")
                raise
            await self._on_thread(_commit, conn)
            return outcomes

    async def _on_thread(self, call: Callable[..., _T], *args: object) -> _T:
        """``call(*args)`` on the thread. Cancelled meanwhile, it still waits for the
        call to end before it raises, so the caller lets go of the connection only then."""
        job = asyncio.get_running_loop().run_in_executor(self._thread, call, *args)
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            await asyncio.wait([job])
            raise

    async def close(self) -> None:
        """Close the connection and end the thread; again, it does nothing."""
        if self._closed:
            return
        self._closed = True
        async with self._using:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._close)
        self._thread.shutdown(wait=True)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()  # a transaction still open (a cancelled batch) is rolled back
            self._conn = None


def _begin_now(conn: sqlite3.Connection) -> bool:
    """``begin immediate`` if no other connection holds the write lock; False, and
    no transaction, if one does (then ``_begin`` waits for it on the thread)."""
    conn.execute("pragma busy_timeout = 0")
    try:
        conn.execute("begin immediate")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # BUSY_RECOVERY too
            raise
        return False
    finally:
        conn.execute(f"pragma busy_timeout = {db.BUSY_TIMEOUT_MS}")
    return True


def _begin(creates: _CreateThread) -> sqlite3.Connection:
    """On the create thread: the connection, in a write transaction (waiting for the
    write lock as long as the busy timeout allows)."""
    conn = creates._connect()
    conn.execute("begin immediate")
    return conn


def _commit(conn: sqlite3.Connection) -> None:
    """On the create thread: commit, or roll back and raise."""
    try:
        conn.execute("commit")
    except BaseException:
        if conn.in_transaction:
            conn.execute("rollback")
        raise


def _stage_batch(conn: sqlite3.Connection, batch: Sequence[tuple[NewKey, int]]) -> list[_Made]:
    """The batch's keys, inserted in the transaction begun for them. Should a constraint
    refuse any of them (a taken keyIdHash, a role deleted meanwhile), it starts again
    one key at a time, each in its own savepoint, so that only that request fails.

    The new keys' key_roles rows move the authorization generation (schema.sql's
    triggers); it is put back as it was, since no cache can hold a key that was not
    committed and a batch changes no other key: creates drop no cache."""
    conn.execute("savepoint whole_batch")
    (generation,) = conn.execute(_GENERATION).fetchone()
    try:
        outcomes = _insert_batch(conn, batch)
    except sqlite3.IntegrityError:
        conn.execute("rollback to whole_batch")
        outcomes = [_insert_alone(conn, item) for item in batch]
    conn.execute(_SET_GENERATION, (generation,))
    conn.execute("release whole_batch")
    return outcomes


def _insert_batch(conn: sqlite3.Connection, batch: Sequence[tuple[NewKey, int]]) -> list[_Made]:
    """Insert the batch's keys with one statement per table; IntegrityError if any is refused."""
    orgs = list(dict.fromkeys(new.organization_id for new, _ in batch))
    counts: dict[str, int] = {}
    # Each organization's last org_seq: a key gets the next, its place in the organization.
    last: dict[str, int] = {}
    for org, count, last_seq in conn.execute(_COUNT_KEYS_OF, (json.dumps(orgs),)):
        counts[org], last[org] = count, last_seq
    planned: list[tuple[str | None, Exception | None]] = []
    key_rows, role_rows = [], []
    granted = _granted_roles(conn, batch)
    for new, max_keys in batch:
        org = new.organization_id
        if counts.get(org, 0) >= max_keys:
            planned.append((None, _over_limit(max_keys)))
            continue
        beyond = _beyond_grantor(new, granted)
        if beyond is not None:
            planned.append((None, beyond))
            continue
        counts[org] = counts.get(org, 0) + 1
        last[org] = last.get(org, 0) + 1
        key_id = str(uuid.uuid4())
        key_rows.append(_key_row(key_id, last[org], new))
        role_rows += [(key_id, role_id) for role_id in dict.fromkeys(new.role_ids)]
        planned.append((key_id, None))
    keys: dict[str, Key] = {}
    if key_rows:
        # Many rows to a statement: each statement run costs its own overhead, whatever
        # the rows, and the loop waits for all of them.
        _insert_rows(conn, _INSERT_KEYS, key_rows)
        _insert_rows(conn, _INSERT_KEY_ROLES, role_rows)
        ids = json.dumps([row[0] for row in key_rows])
        rows = conn.execute(_KEYS_WITH_IDS, (ids,)).fetchall()
        role_of_keys = conn.execute(_ROLES_OF_KEYS, (ids,)).fetchall()
        keys = {key.id: key for key in _with_roles(rows, role_of_keys)}
    return [(None if key_id is None else keys[key_id], error) for key_id, error in planned]


def _granted_roles(
    conn: sqlite3.Connection, batch: Sequence[tuple[NewKey, int]]
) -> dict[str, Role]:
    """The roles of the batch's checked creates, by ID, as they are now."""
    ids = list(
        dict.fromkeys(r for new, _ in batch if new.grantor is not None for r in new.role_ids)
    )
    if not ids:
        return {}
    return {role.id: role for role in map(_role, conn.execute(_GRANTED_ROLES, (json.dumps(ids),)))}


def _beyond_grantor(new: NewKey, granted: dict[str, Role]) -> Forbidden | None:
    """Why ``new`` is refused, if a role it gets now holds more than its creator: the
    roles were checked before the write, and another write may have widened one since.
    A role deleted since is not here: the insert refuses it."""
    if new.grantor is None:
        return None
    for role_id in new.role_ids:
        role = granted.get(role_id)
        refusal = None if role is None else cannot_grant(new.grantor, role.name, role.permissions)
        if refusal is not None:
            return Forbidden(refusal)
    return None


def _insert_rows(conn: sqlite3.Connection, into: str, rows: Sequence[tuple[object, ...]]) -> None:
    """``into`` (``insert into t (columns) values``) for ``rows``, ROWS_PER_INSERT at a time.
    Only the placeholders are built: the values are parameters, as everywhere."""
    for start in range(0, len(rows), ROWS_PER_INSERT):
        chunk = rows[start : start + ROWS_PER_INSERT]
        row = "(" + ", ".join("?" * len(chunk[0])) + ")"
        conn.execute(into + ", ".join([row] * len(chunk)), [v for r in chunk for v in r])


def _insert_alone(conn: sqlite3.Connection, item: tuple[NewKey, int]) -> _Made:
    """One key in a savepoint of its own: a refusal fails only this request."""
    conn.execute("savepoint one_create")
    made: _Made
    try:
        (made,) = _insert_batch(conn, [item])
    except Exception as exc:
        conn.execute("rollback to one_create")
        made = (None, _refused(exc))
    conn.execute("release one_create")
    return made


def _refused(exc: Exception) -> Exception:
    """What a request whose key alone was refused is told; other failures are 500s."""
    if isinstance(exc, sqlite3.IntegrityError):
        if "key_id_hash" in str(exc):
            return Conflict(_KEY_ID_TAKEN)
        if "FOREIGN KEY" in str(exc):  # key_roles.role_id: the role was deleted meanwhile
            return Conflict(_ROLE_GONE)
    return exc


@asynccontextmanager
async def open_checked(
    settings: Settings, *, observer: Observer | None = None, create: bool = True
) -> AsyncIterator[tuple[Store, Hasher]]:
    """The store for ``settings``, migrated, writable and checked against its pepper;
    closed on exit. ``create=False``: the database must exist already (see ``db``).

    A database that cannot be used stops here with a ConfigError naming its path.
    """
    path = settings.db_path
    if not create:
        db.require_existing(path)
    try:
        store = await Store.open(
            path, observer=observer, cache_size=settings.cache_size, create=create
        )
    except sqlite3.Error as exc:
        raise db.unusable(path, exc) from None
    except ConfigError as exc:
        raise ConfigError(f"database {path}: {exc}") from None
    try:
        try:
            await store.check_writable()
        except sqlite3.Error as exc:
            raise db.unusable(path, exc) from None
        recorded = await store.recorded_pepper()
        pepper = load_pepper(settings.pepper, settings.pepper_path, create=recorded is None)
        hasher = Hasher(pepper)
        await store.check_pepper(hasher.fingerprint())
        yield store, hasher
    finally:
        await store.close()
