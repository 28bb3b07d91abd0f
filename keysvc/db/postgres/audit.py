"""``keysvc audit verify`` on a PostgreSQL database: the same checks as on SQLite's file
(``keysvc.db.sqlite.audit``, ``keysvc.db.activities.verify``, ``keysvc.db.replay``), read in one
REPEATABLE READ, read-only transaction, so that every statement sees one snapshot
while instances go on writing.

The checks are SQLite's own code, which reads through a synchronous connection; here
it runs on a thread, and each statement it makes is run on the event loop's asyncpg
connection, inside the snapshot, its rows fetched in batches as it iterates them.
"""

import asyncio
import sqlite3
from collections.abc import Coroutine, Iterator, Sequence
from typing import Any, TypeVar, cast

import asyncpg

from keysvc.config import ConfigError
from keysvc.credentials import ACTIVITY_CHAIN, Hasher
from keysvc.db.activities import OLD_SCHEMA, WRONG_PEPPER, Chain, Verdict, verify
from keysvc.db.dialect import postgres_text
from keysvc.db.postgres import schema as pgschema
from keysvc.db.sqlite.migrations import schema_version

BATCH_ROWS = 1_000
# What verify says to open and close its own read transaction: the snapshot here is
# already open, and is closed by its owner.
_OWN_TRANSACTION = ("begin", "rollback")
_PEPPER = "select value from meta where name = 'pepper'"

T = TypeVar("T")


class _Snapshot:
    """The calls ``verify`` makes of a sqlite3 connection (``execute``, its rows
    iterated), answered from a PostgreSQL transaction on ``loop``. Used from another
    thread than the loop's."""

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop):
        self._conn = conn
        self._loop = loop

    def _wait(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    async def _cursor(self, sql: str, params: Sequence[object]) -> Any:
        return await self._conn.cursor(postgres_text(sql), *params)

    def execute(self, sql: str, params: Sequence[object] = ()) -> Iterator[tuple[Any, ...]]:
        if sql.strip() in _OWN_TRANSACTION:
            return iter(())
        return self._rows(sql, params)

    def _rows(self, sql: str, params: Sequence[object]) -> Iterator[tuple[Any, ...]]:
        cursor = self._wait(self._cursor(sql, params))
        while batch := self._wait(cursor.fetch(BATCH_ROWS)):
            yield from (tuple(row) for row in batch)


async def _verify(url: str, pepper: bytes) -> Verdict:
    try:
        conn = await asyncpg.connect(url)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise ConfigError(f"cannot use the PostgreSQL database: {exc}") from None
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            version = await pgschema.recorded_version(conn)
            if version == 0:
                raise ConfigError("the database has no keysvc schema: correct the URL")
            if version < schema_version():
                raise ConfigError(f"database: {OLD_SCHEMA}")
            hasher = Hasher(pepper)
            if await conn.fetchval(_PEPPER) != hasher.fingerprint():
                raise ConfigError(WRONG_PEPPER)
            # It answers every call verify makes of its connection.
            snapshot = cast(sqlite3.Connection, _Snapshot(conn, asyncio.get_running_loop()))
            chain = Chain(hasher.derive(ACTIVITY_CHAIN))
            return await asyncio.to_thread(verify, snapshot, chain)
    except asyncpg.PostgresError as exc:
        raise ConfigError(f"the database cannot be read: {exc}") from None
    finally:
        await conn.close()


def verify_url(url: str, pepper: bytes) -> Verdict:
    """``keysvc.db.sqlite.audit.verify_file``'s answer, for the PostgreSQL database at ``url``."""
    return asyncio.run(_verify(url, pepper))
