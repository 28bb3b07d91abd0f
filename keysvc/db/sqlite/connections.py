"""Opening SQLite connections, their pragmas and file modes, and the one write path.

A database keysvc creates is made 0600 before SQLite opens it, whatever the
umask; SQLite gives the ``-wal`` and ``-shm`` files it makes beside it the
database's own mode, so they are 0600 too. A file that already exists keeps
the mode its owner gave it.

Only ``keysvc bootstrap`` makes a new database: the other commands open one
that exists (``create=False``), so a mistyped path is refused rather than
served empty. Every connection but bootstrap's first opens the file with
SQLite's ``mode=rw`` (``existing_uri``), never creating it: a file removed while
keysvc serves is not made again, empty, by a connection opened later (the key
counts of ``/metrics``, say). A database this process cannot write is refused
at start with the reason, not at the first write a client makes.

``Writer`` holds the process's one writing connection and the lock that makes
each write its own ``BEGIN IMMEDIATE`` transaction (``transaction()``).
"""

import asyncio
import logging
import os
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import aiosqlite

from keysvc.config import ConfigError
from keysvc.db.contract import Connection
from keysvc.db.sqlite.diskspace import LOCKED, DiskSpace
from keysvc.db.sqlite.filewatch import FileWatch, refuse_split_index
from keysvc.db.statements import to_the_end
from keysvc.errors import DatabaseUnavailable

logger = logging.getLogger("keysvc")

# Owner read and write only, as the pepper file.
DB_MODE = 0o600
# How long a statement waits for another connection's lock before SQLITE_BUSY.
BUSY_TIMEOUT_MS = 5000
PRAGMAS = (
    "pragma journal_mode = wal",
    "pragma synchronous = full",
    "pragma foreign_keys = on",
    f"pragma busy_timeout = {BUSY_TIMEOUT_MS}",
)


def create_private(path: Path) -> None:
    """Create ``path`` empty and 0600 if it does not exist (SQLite would make it
    0666 less the umask); an empty file is a new database to SQLite."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, DB_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, DB_MODE)  # a umask such as 0o277 would have taken the write bit
    finally:
        os.close(fd)


_warned: set[Path] = set()


def warn_if_exposed(path: Path) -> None:
    """Log once per process when the database file is open to its group or others, as
    one made by an older keysvc is (0644): its mode is the operator's to keep, but
    the keyed hashes in it are worth keeping private. Asked once the database has
    been found usable, so that a refusal at start stays one line."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    if mode & 0o077 and path not in _warned:
        _warned.add(path)
        logger.warning(
            "database file %s has mode %s, readable beyond its owner: chmod 600 it",
            path,
            oct(mode),
        )


def require_existing(path: Path) -> None:
    """Refuse a database file that is not there (or empty): only bootstrap makes one."""
    if not path.is_file() or path.stat().st_size == 0:
        raise ConfigError(
            f"no database at {path}: make one with `keysvc bootstrap --db {path}`,"
            " or correct the path"
        )


def unusable(path: Path, exc: sqlite3.Error) -> ConfigError:
    """The one-line reason the database at ``path`` cannot be opened for writing."""
    folder = path.absolute().parent
    if path.exists() and not os.access(path, os.W_OK):
        reason = "the file is read-only to this user (see its mode, its owner and its mount)"
    elif not os.access(folder, os.W_OK | os.X_OK):
        reason = (
            f"its folder {folder} is read-only to this user, and SQLite writes"
            f" {path.name}-wal and {path.name}-shm beside it"
        )
    else:
        reason = str(exc)
    return ConfigError(f"cannot use the database {path}: {reason}")


def existing_uri(path: Path) -> str:
    """The URI that opens the database at ``path`` only if it exists (``mode=rw``)."""
    return path.absolute().as_uri() + "?mode=rw"


async def connect(path: Path, *, create: bool = True) -> aiosqlite.Connection:
    """An autocommit connection (transactions are explicit) with the pragmas set.

    ``create=False`` opens only a file that exists: SQLite makes no new one. A file
    whose WAL index another process lost is refused (``refuse_split_index``).
    """
    refuse_split_index(path)
    if create:
        create_private(path)
        conn = await aiosqlite.connect(path, isolation_level=None)
    else:
        conn = await aiosqlite.connect(existing_uri(path), isolation_level=None, uri=True)
    try:
        conn.row_factory = sqlite3.Row
        for pragma in PRAGMAS:
            await conn.execute(pragma)
    except BaseException:
        await conn.close()
        raise
    return conn


def connect_now(path: Path, *, shared: bool = False) -> sqlite3.Connection:
    """``connect``'s synchronous twin, for create batches. ``shared``: usable from
    threads other than the one that opened it (one at a time: the caller's care).
    Opens only a file that exists."""
    conn = sqlite3.connect(
        existing_uri(path), isolation_level=None, check_same_thread=not shared, uri=True
    )
    try:
        conn.row_factory = sqlite3.Row
        for pragma in PRAGMAS:
            conn.execute(pragma)
    except BaseException:
        conn.close()
        raise
    return conn


def connect_point_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection for indexed point reads run on the event loop itself
    (``keysvc.db.sqlite.pointreads``): a few pages each, cheaper than the hand-over to a
    connection's thread. It never waits for a lock (busy_timeout 0): a read that finds
    the database busy is retried on the reader's thread instead of stalling the loop."""
    conn = sqlite3.connect(existing_uri(path), isolation_level=None, uri=True)
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("pragma query_only = on")
        conn.execute("pragma busy_timeout = 0")
    except BaseException:
        conn.close()
        raise
    return conn


class Writer:
    """The process's writing connection, and the lock each write transaction holds.

    ``on_authorization_changed`` runs after a transaction that said
    ``authorization_changed`` has committed (the cache owner drops what it holds);
    other processes see the generation move. ``file``: a transaction commits only
    while the database file is still the one opened (``keysvc.db.sqlite.filewatch``).
    """

    def __init__(
        self,
        conn: aiosqlite.Connection,
        space: DiskSpace,
        on_authorization_changed: Callable[[], None],
        file: FileWatch,
    ):
        self.conn = conn
        # Whether writes find the disk full (keysvc.db.sqlite.diskspace), for every write path.
        self.space = space
        self.file = file
        self.lock = asyncio.Lock()
        self._on_authorization_changed = on_authorization_changed
        # Set by authorization_changed inside the running transaction (writes are serial).
        self._authorization_changed = False
        # Whether the running transaction's caller was cancelled during its commit.
        self._commit_cancelled = False

    @asynccontextmanager
    async def transaction(
        self, begun: Callable[[], AbstractAsyncContextManager[Connection]] | None = None
    ) -> AsyncIterator[Connection]:
        """One write transaction; holds the process's write lock throughout. On this
        connection, or in the transaction ``begun`` gives (another connection's, that
        begins and commits it: the create batches', ``CreateThread.transaction``).
        Refused at once (503) if, while it waited for the lock, a write found the
        database locked by another process past the busy timeout (``DiskSpace.locked_since``)."""
        arrived = time.monotonic()
        async with self.lock:
            if self.space.locked_since(arrived):
                raise DatabaseUnavailable(LOCKED)
            try:
                async with self._transaction(begun or self._here) as conn:
                    yield conn
            finally:
                await self.keep_lost_wal()

    @asynccontextmanager
    async def _transaction(
        self, begun: Callable[[], AbstractAsyncContextManager[Connection]]
    ) -> AsyncIterator[Connection]:
        self._authorization_changed = False
        self._commit_cancelled = False
        try:
            async with begun() as conn:
                yield conn
        except sqlite3.Error as exc:
            failure = self.space.failed(exc)
            if failure is exc:
                raise
            raise failure from None
        self.space.succeeded()
        if self._authorization_changed:
            self._on_authorization_changed()
        if self._commit_cancelled:
            raise asyncio.CancelledError

    @asynccontextmanager
    async def _here(self) -> AsyncIterator[Connection]:
        """A transaction on this connection; a commit whose caller was cancelled meanwhile
        is awaited to its end, then said (``_commit_cancelled``)."""
        await self.conn.execute("begin immediate")
        try:
            yield self.conn
            self.file.check()  # else rolled back: see keysvc.db.sqlite.filewatch
            self._commit_cancelled = await to_the_end(self.conn.execute("commit"))
        except BaseException:
            # SQLite may have rolled back already (a full disk does).
            if self.conn.in_transaction:
                await self.conn.execute("rollback")
            raise

    async def keep_lost_wal(self) -> None:
        """With the lock held and no transaction open: if the write-ahead log is no
        longer the file opened, copy what it holds into the database file (a full
        checkpoint through this connection, which still has the lost log open), once
        (``keysvc.db.sqlite.filewatch``). A write committed just before the log went is
        so kept, though its answer went out."""
        if not self.file.wal_to_save():
            return
        try:
            row = await (await self.conn.execute("pragma wal_checkpoint(full)")).fetchone()
        except sqlite3.Error as exc:
            logger.error("the lost write-ahead log could not be checkpointed: %s", exc)
            return
        busy, logged, copied = (row[0], row[1], row[2]) if row is not None else (1, -1, -1)
        if busy or copied != logged:
            logger.error(
                "the lost write-ahead log was checkpointed only in part (%s of %s pages):"
                " keep keysvc running; it tries again at the next write or /readyz",
                copied,
                logged,
            )
            return
        self.file.wal_saved()
        logger.warning(
            "the lost write-ahead log's %s pages were checkpointed into the database file",
            logged,
        )

    async def authorization_changed(self, conn: Connection) -> None:
        """Inside a transaction: what some key may do has changed. Bumps the generation."""
        await conn.execute(
            "update meta set value = cast(value as integer) + 1 where name = 'auth_generation'"
        )
        self._authorization_changed = True

    async def check_writable(self) -> None:
        """Fail now (sqlite3.OperationalError) if this process cannot write the
        database, rather than at a client's first write. Nothing is kept."""
        async with self.lock:
            await self.conn.execute("begin immediate")
            try:
                await self.conn.execute(
                    "insert or replace into meta (name, value) values ('write check', '')"
                )
            finally:
                await self.conn.execute("rollback")

    async def close(self) -> None:
        await self.conn.close()
