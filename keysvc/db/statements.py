"""Statement and transaction helpers both backends' SQL functions share: one call for
a statement's rows, multi-row inserts, savepoints, and a commit awaited to its end."""

import asyncio
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any

from keysvc.db.contract import Connection


# One trip to the connection's thread each (execute, fetch and close together), where
# a cursor would take three: each trip is a queue hand-over and a wake-up of the loop.
def many_rows(into: str, count: int, width: int) -> str:
    """``into`` (``insert into t (columns) values``) with ``count`` rows of ``width``
    placeholders. Only the placeholders are built: the values are parameters."""
    row = "(" + ", ".join("?" * width) + ")"
    return into + ", ".join([row] * count)


def many_row_statements(
    into: str, rows: Sequence[Sequence[object]], per: int
) -> Iterator[tuple[str, list[object]]]:
    """``into``'s statements (``many_rows``) for ``rows``, ``per`` rows a statement, each
    with its parameters: the caller runs them on its connection, as it runs statements."""
    for start in range(0, len(rows), per):
        chunk = rows[start : start + per]
        yield many_rows(into, len(chunk), len(chunk[0])), [value for row in chunk for value in row]


async def fetch_one(conn: Connection, sql: str, params: Sequence[object]) -> Any:
    rows = await conn.execute_fetchall(sql, params)
    return next(iter(rows), None)


async def fetch_all(conn: Connection, sql: str, params: Sequence[object]) -> list[Any]:
    return list(await conn.execute_fetchall(sql, params))


async def to_the_end(awaitable: Awaitable[object]) -> bool:
    """Await ``awaitable`` to its end even when the caller is cancelled meanwhile, and
    say whether it was. A commit runs on aiosqlite's thread whatever happens to the
    coroutine awaiting it: cancelled there, the transaction would be taken for
    uncommitted (a rollback queued behind the commit, its caches' invalidation
    skipped) while it is in the database."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            return cancelled
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True


async def tentatively(conn: Connection) -> None:
    """Inside a transaction: what follows can be undone alone (``settle``), so that a
    write can be made, read back and compared before deciding to keep it."""
    await conn.execute("savepoint tentative")


async def settle(conn: Connection, keep: bool) -> None:
    """End what ``tentatively`` began: kept, or undone as if never written."""
    if not keep:
        await conn.execute("rollback to tentative")
    await conn.execute("release tentative")
