"""PostgreSQL's reads outside a transaction: ``PgReader``, each statement on whichever
pooled connection is free (``keysvc.db.postgres.connection.acquired``: bounded, and a
broken connection is not lent again), answering the calls SQLite's reader connection
and point reader answer; a database that does not answer is a 503 (``Outage``).
"""

from typing import Any

from keysvc.db.contract import Accept
from keysvc.db.postgres.connection import UNAVAILABLE, Done, Outage, PgConnection, acquired


class PgReader:
    """Reads on pooled connections, each statement on whichever is free: what SQLite's
    reader connection answers, with the same calls (``execute_fetchall``)."""

    def __init__(self, pool: Any, outage: Outage, timeout: float | None = None):
        self._pool = pool
        self._outage = outage
        # Each statement's bound; None: the pool's (STATEMENT_SECONDS).
        self._timeout = timeout

    in_transaction = False

    async def execute_fetchall(self, sql: str, params: Any = ()) -> list[Any]:
        return await self._fetch(sql, params)

    async def execute(self, sql: str, params: Any = ()) -> Done:
        try:
            async with acquired(self._pool, self._outage) as raw:
                return await PgConnection(raw, self._timeout).execute(sql, params)
        except UNAVAILABLE as exc:
            raise self._outage.unavailable(exc) from None

    async def executemany(self, sql: str, params: Any) -> None:
        try:
            async with acquired(self._pool, self._outage) as raw:
                await PgConnection(raw, self._timeout).executemany(sql, params)
        except UNAVAILABLE as exc:
            raise self._outage.unavailable(exc) from None

    async def rows(self, sql: str, params: Any, accept: Accept = bool) -> list[Any]:
        """A point read (``keysvc.db.sqlite.pointreads.PointReader.rows``): on the
        primary, where every commit is, so ``accept`` is not needed."""
        return await self._fetch(sql, params)

    async def _fetch(self, sql: str, params: Any) -> list[Any]:
        try:
            async with acquired(self._pool, self._outage) as raw:
                return await PgConnection(raw, self._timeout).execute_fetchall(sql, params)
        except UNAVAILABLE as exc:
            raise self._outage.unavailable(exc) from None
