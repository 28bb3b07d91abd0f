"""A PostgreSQL connection (asyncpg) that the data layer's SQL functions take where
they take SQLite's (aiosqlite): the same calls, ``execute``, ``executemany`` and
``execute_fetchall``, the statement given in SQLite's dialect and run in its
PostgreSQL form (``keysvc.db.dialect``).

Rows are asyncpg's records, read by column name or position as ``sqlite3.Row`` is.
A constraint's refusal is raised as ``IntegrityRefusal``, a ``sqlite3.IntegrityError``,
worded as SQLite words it (the kind of constraint, then what it guards), so that the
code that tells a taken key ID from a deleted role reads both backends alike. The
wording names the constraint, never the values refused (keyed hashes included).
"""

import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg

from keysvc.db.dialect import postgres_text
from keysvc.errors import DatabaseUnavailable

logger = logging.getLogger("keysvc")

# What a database that is down, unreachable or dropping its connections raises.
UNAVAILABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # A pooled connection whose protocol is out of step after its backend was killed
    # mid-statement (asyncpg: "cannot switch to state ..."); the reader terminates it.
    asyncpg.InternalClientError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    # A write transaction the server ended for idling (keysvc.db.postgres.store's
    # IDLE_IN_WRITE_SECONDS: its process was stopped, or cut off), its session with it.
    asyncpg.IdleInTransactionSessionTimeoutError,
    # A database closed to connections (ALTER DATABASE ... ALLOW_CONNECTIONS false).
    asyncpg.ObjectNotInPrerequisiteStateError,
    # A server that cannot take writes now: read-only (a standby promoted to, or
    # default_transaction_read_only; 25006), out of disk, memory or connections (class
    # 53, 53100 disk_full included), a lock not had within lock_timeout (55P03), a
    # statement the server cancelled (its statement_timeout, 57014). 57P01..57P03
    # (admin shutdown, crash, cannot connect now) are above.
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.InsufficientResourcesError,
    asyncpg.LockNotAvailableError,
    asyncpg.QueryCanceledError,
)
# At most one log line this often while the database stays unavailable.
UNAVAILABLE_LOG_SECONDS = 10.0
# The bounds of every call to the database: a connection made, a pooled one waited
# for, a statement answered. Past one, the call is a 503: a server that stopped
# answering (frozen, or cut off without a reset) holds no request longer than this,
# where the TCP stack alone would wait for about 15 minutes. TimeoutError is an
# OSError, and so in UNAVAILABLE.
CONNECT_SECONDS = 5.0
# The bound of the connection an instance starts on (its migration's): longer, since
# nothing waits on it but the start, and a server busy with other clients took more
# than CONNECT_SECONDS to let one in (seen once on a loaded CI machine: the start
# failed, the database up). The pool's connections keep CONNECT_SECONDS: a request
# may wait on them.
START_CONNECT_SECONDS = 20.0
ACQUIRE_SECONDS = 5.0
STATEMENT_SECONDS = 10.0
# The keys-by-state count (keysvc.db.keystates), a scan that takes seconds over
# millions of keys: a scrape waits for it at most every 30 s.
COUNT_SECONDS = 30.0
# /readyz's one statement: not ready within a few seconds of the server freezing.
READY_SECONDS = 3.0


class Outage:
    """A store's answer to a database that does not answer: keysvc's 503, logged at
    most once every UNAVAILABLE_LOG_SECONDS. The pool makes new connections by itself
    once the database is back."""

    def __init__(self) -> None:
        self._logged_at: float | None = None

    def unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= UNAVAILABLE_LOG_SECONDS:
            self._logged_at = now
            logger.warning("PostgreSQL unavailable (%s); answering 503", type(exc).__name__)
        return DatabaseUnavailable()


@asynccontextmanager
async def acquired(
    pool: Any, outage: Outage | None, timeout: float = ACQUIRE_SECONDS
) -> AsyncIterator[Any]:
    """A pooled connection, waited for at most ``timeout``. A connection the server
    refuses (a role that may not log in, a database dropped, a wrong password, a
    pg_hba.conf rule) is a 503, as a server that is down is (without ``outage``, a
    replica's: the driver's error itself). One whose statement timed out or whose
    protocol is out of step is terminated, not lent again: its server process may
    still be busy, or never answer."""
    try:
        raw = await pool.acquire(timeout=timeout)
    except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
        if outage is None:
            raise
        raise outage.unavailable(exc) from None
    try:
        yield raw
    except (TimeoutError, asyncpg.InternalClientError):
        raw.terminate()
        raise
    finally:
        await pool.release(raw, timeout=ACQUIRE_SECONDS)


# asyncpg's class of each refusal -> SQLite's word for it.
_KINDS = (
    (asyncpg.UniqueViolationError, "UNIQUE"),
    (asyncpg.ForeignKeyViolationError, "FOREIGN KEY"),
    (asyncpg.CheckViolationError, "CHECK"),
    (asyncpg.NotNullViolationError, "NOT NULL"),
)


class IntegrityRefusal(sqlite3.IntegrityError):
    """A constraint refused a PostgreSQL statement."""


def refusal(exc: asyncpg.IntegrityConstraintViolationError) -> IntegrityRefusal:
    kind = next((word for cls, word in _KINDS if isinstance(exc, cls)), "integrity")
    guarded = ".".join(
        str(part) for part in (exc.table_name, exc.column_name, exc.constraint_name) if part
    )
    # A trigger's refusal (raise exception ... using errcode) names what it guards in
    # its own message; a constraint's message carries no values.
    return IntegrityRefusal(f"{kind} constraint failed: {guarded}: {exc.args[0]}")


@dataclass(frozen=True)
class Done:
    """What a statement changed, as a cursor tells it."""

    rowcount: int


def _rowcount(status: str) -> int:
    """The row count in a command tag ('UPDATE 3', 'INSERT 0 2'); -1 when it has none."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else -1


class PgConnection:
    def __init__(self, conn: Any, timeout: float | None = None):
        self.raw = conn
        # Each statement's bound; None: the connection's (STATEMENT_SECONDS on the pool).
        self._timeout = timeout

    @property
    def in_transaction(self) -> bool:
        return bool(self.raw.is_in_transaction())

    async def execute(self, sql: str, params: Iterable[Any] = ()) -> Done:
        try:
            status = await self.raw.execute(postgres_text(sql), *params, timeout=self._timeout)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise refusal(exc) from None
        return Done(_rowcount(str(status)))

    async def executemany(self, sql: str, params: Iterable[Iterable[Any]]) -> None:
        rows = [tuple(row) for row in params]
        if not rows:
            return
        try:
            await self.raw.executemany(postgres_text(sql), rows, timeout=self._timeout)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise refusal(exc) from None

    async def execute_fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        try:
            return list(await self.raw.fetch(postgres_text(sql), *params, timeout=self._timeout))
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise refusal(exc) from None

    async def close(self) -> None:
        await self.raw.close()


async def keep_session(conn: Any) -> None:
    """The pool's reset of a connection given back: nothing beyond asyncpg's own (which
    rolls back a transaction left open). keysvc leaves no session state on a pooled
    connection (no SET, LISTEN, cursor or session-level lock: _WRITE_LOCK and the
    migration's lock are transaction-level), so the default reset statement would only
    cost every read and write one more round trip."""
    return None


async def connect_postgres(url: str) -> PgConnection:
    return PgConnection(await asyncpg.connect(url))
