"""PostgreSQL's reads outside a transaction: ``PgReader``, each statement on whichever
pooled connection is free, answering the calls SQLite's reader connection and point
reader answer; a database that does not answer is a 503 (``Outage``).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg

from keysvc.db.postgres.connection import UNAVAILABLE, Done, Outage, PgConnection


@contextmanager
def _dropped_if_broken(raw: Any) -> Iterator[None]:
    """A connection whose protocol is out of step is terminated, so the pool makes a
    new one rather than lending this one again."""
    try:
        yield
    except asyncpg.InternalClientError:
        raw.terminate()
        raise


class PgReader:
    """Reads on pooled connections, each statement on whichever is free: what SQLite's
    reader connection answers, with the same calls (``execute_fetchall``)."""

    def __init__(self, pool: Any, outage: Outage):
        self._pool = pool
        self._outage = outage

    in_transaction = False

    async def execute_fetchall(self, sql: str, params: Any = ()) -> list[Any]:
        return await self._fetch(sql, params)

    async def execute(self, sql: str, params: Any = ()) -> Done:
        try:
            async with self._pool.acquire() as raw:
                with _dropped_if_broken(raw):
                    return await PgConnection(raw).execute(sql, params)
        except UNAVAILABLE as exc:
            raise self._outage.unavailable(exc) from None

    async def executemany(self, sql: str, params: Any) -> None:
        try:
            async with self._pool.acquire() as raw:
                with _dropped_if_broken(raw):
                    await PgConnection(raw).executemany(sql, params)
        except UNAVAILABLE as exc:
            raise self._outage.unavailable(exc) from None

    async def rows(self, sql: str, params: Any) -> list[Any]:
        """A point read (``keysvc.db.sqlite.pointreads.PointReader.rows``)."""
        return await self._fetch(sql, params)

    async def _fetch(self, sql: str, params: Any) -> list[Any]:
        try:
            async with self._pool.acquire() as raw:
                with _dropped_if_broken(raw):
                    return await PgConnection(raw).execute_fetchall(sql, params)
        except UNAVAILABLE as exc:
            raise self._outage.unavailable(exc) from None
