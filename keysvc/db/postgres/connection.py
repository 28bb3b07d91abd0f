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
from collections.abc import Iterable
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
    # A database closed to connections (ALTER DATABASE ... ALLOW_CONNECTIONS false).
    asyncpg.ObjectNotInPrerequisiteStateError,
)
# At most one log line this often while the database stays unavailable.
UNAVAILABLE_LOG_SECONDS = 10.0


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
    def __init__(self, conn: Any):
        self.raw = conn

    @property
    def in_transaction(self) -> bool:
        return bool(self.raw.is_in_transaction())

    async def execute(self, sql: str, params: Iterable[Any] = ()) -> Done:
        try:
            status = await self.raw.execute(postgres_text(sql), *params)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise refusal(exc) from None
        return Done(_rowcount(str(status)))

    async def executemany(self, sql: str, params: Iterable[Iterable[Any]]) -> None:
        rows = [tuple(row) for row in params]
        if not rows:
            return
        try:
            await self.raw.executemany(postgres_text(sql), rows)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise refusal(exc) from None

    async def execute_fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        try:
            return list(await self.raw.fetch(postgres_text(sql), *params))
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise refusal(exc) from None

    async def close(self) -> None:
        await self.raw.close()


async def connect_postgres(url: str) -> PgConnection:
    return PgConnection(await asyncpg.connect(url))
