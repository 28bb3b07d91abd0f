"""SQL by hand on a test's database, whichever backend the test runs on: what an
operator's (or an attacker's) shell does outside keysvc, on a connection of its own.
SQLite's file gets a plain ``sqlite3`` connection; PostgreSQL's database gets an
``asyncpg`` one, on a thread of its own, as the test's event loop is serving the app.

Statements are written once, in the words both dialects share, with ``?``
placeholders (numbered for PostgreSQL by ``keysvc.db.dialect.postgres_text``).
"""

import asyncio
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg

from keysvc.config import Settings
from keysvc.db.activities import Verdict
from keysvc.db.dialect import postgres_text
from keysvc.ops.audit import verify

Statement = tuple[str, Sequence[Any]]


def hand_transaction(settings: Settings, *statements: Statement) -> list[tuple[Any, ...]]:
    """Run ``statements`` in one transaction, committed; the rows of the last."""
    if settings.db_url is None:
        return _on_sqlite(settings, statements)
    with ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(asyncio.run, _on_postgres(settings.db_url, statements)).result()


def hand_sql(settings: Settings, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """One statement in a transaction of its own; its rows."""
    return hand_transaction(settings, (sql, params))


def hand_value(settings: Settings, sql: str, *params: Any) -> Any:
    """The one value a query answers."""
    ((value,),) = hand_sql(settings, sql, *params)
    return value


def _on_sqlite(settings: Settings, statements: Sequence[Statement]) -> list[tuple[Any, ...]]:
    # A loaded machine can hold the app's write lock past sqlite3's default 5 s wait.
    conn = sqlite3.connect(settings.db_path, isolation_level=None, timeout=30)
    try:
        # Reads take no write lock (WAL readers wait for nobody). This call blocks the
        # test's event loop, so a write transaction the app has open on that loop (a
        # delivery worker's, say) cannot end while we wait: a read that asked for the
        # write lock would wait out its timeout and fail.
        reads_only = all(sql.lstrip().lower().startswith("select") for sql, _ in statements)
        conn.execute("begin" if reads_only else "begin immediate")
        rows: list[tuple[Any, ...]] = []
        for sql, params in statements:
            rows = conn.execute(sql, tuple(params)).fetchall()
        conn.execute("commit")
        return rows
    finally:
        conn.close()


async def _on_postgres(url: str, statements: Sequence[Statement]) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(url)
    try:
        rows: list[tuple[Any, ...]] = []
        async with conn.transaction():
            for sql, params in statements:
                rows = [tuple(row) for row in await conn.fetch(postgres_text(sql), *params)]
        return rows
    finally:
        await conn.close()


def everything_stored(settings: Settings) -> bytes:
    """Everything the database holds, to look for what it must not: on SQLite its file
    and its WAL as they are on disk (free pages included), on PostgreSQL every value
    of every table."""
    if settings.db_url is None:
        wal = settings.db_path.with_name(settings.db_path.name + "-wal")
        return settings.db_path.read_bytes() + (wal.read_bytes() if wal.exists() else b"")
    tables = hand_sql(
        settings, "select tablename from pg_tables where schemaname = 'public' order by 1"
    )
    values = [
        value
        for (table,) in tables
        for row in hand_sql(settings, f'select * from "{table}"')
        for value in row
    ]
    return b"\n".join(v if isinstance(v, bytes) else str(v).encode() for v in values)


def audit_verdict(settings: Settings) -> Verdict:
    """What ``keysvc audit verify`` finds in the test's database, as the command reads
    it: on a connection of its own (PostgreSQL's on a thread, as the test's loop is
    serving the app)."""
    if settings.db_url is None:
        return verify(settings)
    with ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(verify, settings).result()
