"""SQLite's key creates: concurrent creates wait for the next batch (``Creates``), one
transaction and one fsync for them all, each request answered once it has committed.
Here too the batch's connection, the thread that begins and commits it, and the
statements that insert a whole batch of keys and record their activities
(``keysvc.db.activities.record``) in that same transaction. Should one be refused,
the batch starts again a key at a time, each in its own savepoint, so that it fails
only its own request; a create refused so records nothing. So too when one
organization's write budget or webhook queue refuses the batch (``keysvc.db.quota``):
that organization's creates get the 429, the other organizations' go in.
"""

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from keysvc.db import activities as activity_sql
from keysvc.db import keys as key_sql
from keysvc.db.contract import Announce, Connection, KeyEvent, Recheck, Records
from keysvc.db.keys import GRANTED_ROLES, over_limit
from keysvc.db.meta import GENERATION
from keysvc.db.outbox import enqueue_now
from keysvc.db.rows import keys_with_roles, role_from_row
from keysvc.db.seal import Seal
from keysvc.db.sqlite.connections import BUSY_TIMEOUT_MS, Writer, connect_now
from keysvc.db.sqlite.diskspace import LOCKED, DiskSpace
from keysvc.db.sqlite.filewatch import FileWatch
from keysvc.db.statements import many_row_statements
from keysvc.errors import Conflict, DatabaseUnavailable, ServiceUnavailable, TooManyRequests
from keysvc.models import Key, NewKey, Role

_T = TypeVar("_T")

_SET_GENERATION = "update meta set value = ? where name = 'auth_generation'"
# Heads of _insert_rows's statements, and its rows per statement (13 parameters a key
# row; SQLite takes up to 32,766 parameters).
_INSERT_KEYS = key_sql.INSERT_KEY[: key_sql.INSERT_KEY.index("values")] + "values "
_INSERT_KEY_ROLES = "insert into key_roles (key_id, role_id) values "
_INSERT_DETAILS = key_sql.INSERT_DETAILS[: key_sql.INSERT_DETAILS.index("values")] + "values "
ROWS_PER_INSERT = 500
_COUNT_KEYS_OF = """
    select id, key_count, last_key_seq from organizations
    where id in (select value from json_each(?))
"""

# A created key, or why it was not created.
Made = tuple[Key | None, Exception | None]
# A create waiting in a batch: the key, its organization's key limit, its activity and
# its rule.
Create = tuple[NewKey, int, Announce, Recheck | None]


class NowConnection:
    """A sqlite3 connection as the SQL functions use one (``keysvc.db.contract.Connection``):
    each statement runs when it is awaited, on the loop, with no hand-over to a thread
    and nothing to wait for (the write lock is held), so nothing between two statements
    can cancel the transaction halfway."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    async def execute(self, sql: str, parameters: Iterable[Any] = (), /) -> sqlite3.Cursor:
        return self._conn.execute(sql, tuple(parameters))

    async def executemany(self, sql: str, parameters: Iterable[Iterable[Any]], /) -> sqlite3.Cursor:
        return self._conn.executemany(sql, (tuple(row) for row in parameters))

    async def execute_fetchall(self, sql: str, parameters: Iterable[Any] = (), /) -> list[Any]:
        return self._conn.execute(sql, tuple(parameters)).fetchall()

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction


class CreateThread:
    """The connection that writes create batches, and the thread that begins and
    commits them. Only what waits on the database file runs on the thread: the commit
    (its fsync), and ``begin immediate`` when another process holds the write lock;
    the statements between run on the loop (why: docs/PERFORMANCE.md, "Design notes").
    The connection is used by one thread at a time: a batch holds ``_using`` from its
    begin to the end of its commit, even if it is cancelled meanwhile (``_on_thread``),
    and ``close`` takes it too.
    """

    def __init__(
        self, path: Path, chain: activity_sql.Chain, seal: Seal,
        key_event: Callable[[], KeyEvent], file: FileWatch,
    ):  # fmt: skip
        self._path = path
        # A batch commits only while the database file is still the one opened.
        self._file = file
        self._chain = chain
        self._seal = seal
        # The key.created event's body (``Records.key_event``), asked for at each batch.
        self._key_event = key_event
        self._conn: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keysvc-creates")
        self._closed = False
        self._using = asyncio.Lock()

    async def open(self) -> None:
        """Connect now, in the thread, so that a database it cannot open fails the start."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._connect)

    def _connect(self) -> sqlite3.Connection:
        if self._closed and self._conn is None:
            # Never again once closed: an unclosed connection would outlive the WAL-index hold
            # (keysvc.db.sqlite.freshness).
            raise ServiceUnavailable("the database is closed: the server is stopping")
        if self._conn is None:
            # Used by the loop and by the thread in turn, never at once (see the class).
            conn = connect_now(self._path, shared=True)
            # Only a begin waits for a lock, and only on the thread (_begin): on the loop,
            # a begin that finds the lock held gives up at once (_begin_now).
            conn.execute("pragma busy_timeout = 0")
            self._conn = conn
        return self._conn

    async def run(self, batch: list[Create]) -> list[Made]:
        async with self._begun() as conn:
            # Nothing in it waits: the sqlite3 connection runs each statement now, so
            # nothing is cancelled between the batch's keys and their records.
            staged = _Staged(self._key_event(), self._chain, self._seal)
            return await _stage_batch(conn, batch, staged)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A write transaction on this connection for a batch of other writes (a spend
        batch, ``keysvc.db.spendbatch``), as a create batch's: its statements run on the
        loop as they are awaited (``NowConnection``), its commit on the thread. One
        hand-over a transaction, where aiosqlite's writer makes one a statement and
        the begin and the commit (why: docs/PERFORMANCE.md, issue 36, "Round 3").
        The caller holds the writer's lock (``Writer.transaction``)."""
        async with self._begun() as conn:
            yield NowConnection(conn)

    @asynccontextmanager
    async def _begun(self) -> AsyncIterator[sqlite3.Connection]:
        """The connection in a write transaction, held (``_using``) until it has
        committed, on the thread, once the caller's block ends; rolled back if the block
        raises or the database file is no longer the one opened."""
        async with self._using:
            if self._closed:  # before, or while this batch waited for the one before it
                raise ServiceUnavailable("the database is closed: the server is stopping")
            conn = self._conn
            if conn is not None and conn.in_transaction:
                conn.execute("rollback")  # left open by a batch cancelled during its begin
            if conn is None or not _begin_now(conn):
                conn = await self._on_thread(_begin, self)
            try:
                yield conn
                self._file.check()
            except BaseException:
                if conn.in_transaction:  # SQLite may have rolled back already (a full disk)
                    conn.execute("rollback")
                raise
            await self._on_thread(_commit, conn)

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
    no transaction, if one does (then ``_begin`` waits for it on the thread). The
    connection's busy timeout is 0 (``CreateThread._connect``): a write transaction
    waits for no lock after its begin, which takes the write lock for it whole."""
    try:
        conn.execute("begin immediate")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # BUSY_RECOVERY too
            raise
        return False
    return True


def _begin(creates: CreateThread) -> sqlite3.Connection:
    """On the create thread: the connection, in a write transaction (waiting for the
    write lock as long as the busy timeout allows)."""
    conn = creates._connect()
    conn.execute(f"pragma busy_timeout = {BUSY_TIMEOUT_MS}")
    try:
        conn.execute("begin immediate")
    finally:
        conn.execute("pragma busy_timeout = 0")
    return conn


def _commit(conn: sqlite3.Connection) -> None:
    """On the create thread: commit, or roll back and raise."""
    try:
        conn.execute("commit")
    except BaseException:
        if conn.in_transaction:
            conn.execute("rollback")
        raise


@dataclass(frozen=True)
class _Staged:
    """What a batch writes beside its keys: their key.created events (``key_event``,
    rows MACed with ``seal``) and their activities (``chain``, whose quota both are
    charged to)."""

    key_event: KeyEvent
    chain: activity_sql.Chain
    seal: Seal


async def _stage_batch(
    conn: sqlite3.Connection, batch: Sequence[Create], staged: _Staged
) -> list[Made]:
    """The batch's keys, their events and activities, inserted in the transaction begun
    for them. Should a constraint refuse any of them (a taken keyIdHash, a role deleted
    meanwhile), or an organization's write budget or webhook queue (429), it starts
    again one key at a time, each in its own savepoint, so that only that request fails.

    The new keys' key_roles rows move the authorization generation (schema.sql's
    triggers); it is put back as it was, since no cache can hold a key that was not
    committed and a batch changes no other key: creates drop no cache."""
    conn.execute("savepoint whole_batch")
    (generation,) = conn.execute(GENERATION).fetchone()
    try:
        outcomes = await _insert_batch(conn, batch, staged)
    except (sqlite3.IntegrityError, TooManyRequests):
        conn.execute("rollback to whole_batch")
        outcomes = [await _insert_alone(conn, item, staged) for item in batch]
    conn.execute(_SET_GENERATION, (generation,))
    conn.execute("release whole_batch")
    return outcomes


async def _insert_batch(
    conn: sqlite3.Connection, batch: Sequence[Create], staged: _Staged
) -> list[Made]:
    """Insert the batch's keys, their events and activities, a few statements per table;
    IntegrityError or TooManyRequests if any is refused."""
    orgs = list(dict.fromkeys(item[0].organization_id for item in batch))
    counts: dict[str, int] = {}
    # Each organization's last org_seq: a key gets the next, its place in the organization.
    last: dict[str, int] = {}
    for org, count, last_seq in conn.execute(_COUNT_KEYS_OF, (json.dumps(orgs),)):
        counts[org], last[org] = count, last_seq
    planned: list[tuple[str | None, Exception | None]] = []
    key_rows, role_rows, detail_rows = [], [], []
    granted = _granted_roles(conn, batch)
    for new, max_keys, _, recheck in batch:
        org = new.organization_id
        if counts.get(org, 0) >= max_keys:
            planned.append((None, over_limit(max_keys)))
            continue
        refusal = _rechecked(recheck, new, granted)
        if refusal is not None:
            planned.append((None, refusal))
            continue
        counts[org] = counts.get(org, 0) + 1
        last[org] = last.get(org, 0) + 1
        key_id = str(uuid.uuid4())
        key_rows.append(key_sql.key_row(key_id, last[org], new))
        role_rows += [(key_id, role_id) for role_id in dict.fromkeys(new.role_ids)]
        details = key_sql.details_row(
            key_id, new.external_id, new.meta, new.credits, new.ratelimits
        )
        if details is not None:
            detail_rows.append(details)
        planned.append((key_id, None))
    keys: dict[str, Key] = {}
    if key_rows:
        # Many rows to a statement: each statement run costs its own overhead, whatever
        # the rows, and the loop waits for all of them.
        _insert_rows(conn, _INSERT_KEYS, key_rows)
        _insert_rows(conn, _INSERT_KEY_ROLES, role_rows)
        _insert_rows(conn, _INSERT_DETAILS, detail_rows)
        # Issue 36: the identity of each created key's externalId, made if missing.
        for (new, _, _, _), (inserted, _) in zip(batch, planned, strict=True):
            if inserted is not None and new.external_id is not None:
                at = new.created_at
                params = key_sql.identity_params(new.organization_id, new.external_id, at)
                conn.execute(key_sql.ENSURE_IDENTITY, params)
        ids = json.dumps([row[0] for row in key_rows])
        rows = conn.execute(key_sql.KEYS_WITH_IDS, (ids,)).fetchall()
        role_of_keys = conn.execute(key_sql.ROLES_OF_KEYS, (ids,)).fetchall()
        keys = {key.id: key for key in keys_with_roles(rows, role_of_keys)}
        # The creates' key.created events, in the transaction that writes their keys.
        created = [
            (key.organization_id, staged.key_event(key), key.created_at) for key in keys.values()
        ]
        enqueue_now(conn, staged.seal, staged.chain.quota, "key.created", created)
    outcomes = [(None if key_id is None else keys[key_id], error) for key_id, error in planned]
    made = [
        announce(key)
        for (_, _, announce, _), (key, _) in zip(batch, outcomes, strict=True)
        if key is not None
    ]
    await activity_sql.record(conn, staged.chain, *made)
    return outcomes


def _granted_roles(conn: sqlite3.Connection, batch: Sequence[Create]) -> dict[str, Role]:
    """The roles of the batch's rechecked creates, by ID, as they are now."""
    ids = list(
        dict.fromkeys(
            r for new, _, _, recheck in batch if recheck is not None for r in new.role_ids
        )
    )
    if not ids:
        return {}
    return {
        role.id: role
        for role in map(role_from_row, conn.execute(GRANTED_ROLES, (json.dumps(ids),)))
    }


def _insert_rows(conn: sqlite3.Connection, into: str, rows: Sequence[tuple[object, ...]]) -> None:
    """``into`` (``insert into t (columns) values``) for ``rows``, ROWS_PER_INSERT at a time.
    Only the placeholders are built: the values are parameters, as everywhere."""
    for sql, values in many_row_statements(into, rows, ROWS_PER_INSERT):
        conn.execute(sql, values)


async def _insert_alone(conn: sqlite3.Connection, item: Create, staged: _Staged) -> Made:
    """One key in a savepoint of its own: a refusal fails only this request."""
    conn.execute("savepoint one_create")
    made: Made
    try:
        (made,) = await _insert_batch(conn, [item], staged)
    except Exception as exc:
        conn.execute("rollback to one_create")
        made = (None, _refused(exc))
    conn.execute("release one_create")
    return made


def _refused(exc: Exception) -> Exception:
    """What a request whose key alone was refused is told; other failures are 500s."""
    if isinstance(exc, sqlite3.IntegrityError):
        if "key_id_hash" in str(exc):
            return Conflict(key_sql.KEY_ID_TAKEN)
        if "FOREIGN KEY" in str(exc):  # key_roles.role_id: the role was deleted meanwhile
            return Conflict(key_sql.ROLE_GONE)
    return exc


def _rechecked(recheck: Recheck | None, new: NewKey, granted: dict[str, Role]) -> Exception | None:
    """The domain's refusal of ``new`` (``Recheck``), if any. A rule that raises refuses
    that create alone, as the batch's other creates, other organizations' too, must
    not fail with it."""
    if recheck is None:
        return None
    try:
        return recheck(new, granted)
    except Exception as exc:
        return exc


@dataclass
class _PendingCreate:
    new: NewKey
    max_keys: int
    announce: Announce
    recheck: Recheck | None
    done: "asyncio.Future[Key]" = field(repr=False)
    # When it arrived (time.monotonic): see Creates._flush.
    arrived: float = field(default_factory=time.monotonic)


class Creates:
    """Creates waiting for the next batch, and the task that writes the batches.

    A batch holds the writer's lock, as every write transaction does, so creates
    that arrive while a write runs pile up for the next batch.
    """

    def __init__(
        self, path: Path, writer: Writer, chain: activity_sql.Chain, seal: Seal,
        records: Records,
    ):  # fmt: skip
        self.thread = CreateThread(path, chain, seal, records.key_event_of, writer.file)
        self._writer = writer
        self._pending: list[_PendingCreate] = []
        self.flusher: asyncio.Task[None] | None = None

    async def open(self) -> None:
        await self.thread.open()

    async def create(
        self,
        new: NewKey,
        max_keys: int,
        announce: Announce,
        recheck: Recheck | None = None,
    ) -> Key:
        """Store a key; answered only once the transaction holding it has committed.
        ``recheck`` runs in that transaction (``Recheck``), and so does the
        record of the activity ``announce`` makes of the key."""
        done = asyncio.get_running_loop().create_future()
        pending = _PendingCreate(new, max_keys, announce, recheck, done)
        self._pending.append(pending)
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush())
        return await asyncio.shield(pending.done)

    async def _flush(self) -> None:
        while self._pending:
            async with self._writer.lock:
                batch, self._pending = self._pending, []
                # Those that waited while a write found the database locked by another
                # process past the busy timeout are refused with it, as the writer's own
                # waiting writes are, rather than wait the timeout again (rt54 S1).
                space, waited, batch = self._writer.space, batch, []
                for item in waited:
                    if not space.locked_since(item.arrived):
                        batch.append(item)
                    elif not item.done.done():
                        item.done.set_exception(DatabaseUnavailable(LOCKED))
                if not batch:
                    continue
                try:
                    await self._create_batch(batch)
                finally:
                    await self._writer.keep_lost_wal()  # keysvc.db.sqlite.filewatch

    async def _create_batch(self, batch: list[_PendingCreate]) -> None:
        """One transaction for the whole batch (``CreateThread``); each request is
        answered once it has committed."""
        work = [(item.new, item.max_keys, item.announce, item.recheck) for item in batch]
        running = asyncio.ensure_future(self.thread.run(work))
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            # The batch runs to its end (shielded); its requests still get their answers.
            running.add_done_callback(lambda done: _settle(batch, done, self._writer.space))
            raise
        except Exception:  # noqa: S110 - the failure is each request's answer, see _settle
            pass
        _settle(batch, running, self._writer.space)


def _settle(
    batch: Sequence[_PendingCreate],
    done: "asyncio.Future[list[Made]]",
    space: DiskSpace,
) -> None:
    """Answer each request of a finished batch: its key, or why it failed (a full
    disk as ``space`` says, once for the batch)."""
    if done.cancelled() or done.exception() is not None:
        failure = done.exception() if not done.cancelled() else None
        cause = space.failed(failure) if isinstance(failure, Exception) else None
        outcomes: list[Made] = [(None, cause or RuntimeError("create cancelled"))] * len(batch)
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
