"""Indexed point reads run on the event loop, with no hand-over to a thread.

A key looked up by its ID or by its key-ID hash reads a few pages through
indexes: less work than handing the statement to an aiosqlite connection's
thread and waking the loop for its answer. ``PointReader`` runs such statements
synchronously on a read-only connection of its own (``connect_point_reader``),
which never waits for a lock; when the database is busy (SQLite's recovery of
a WAL index after a crash), the statement runs on the reader's thread instead,
so the loop never stalls. Any other failure while the database file is no longer
the one opened (``keysvc.db.sqlite.filewatch``) is that: 503, not an internal error.
Only statements that read a bounded handful of rows
through an index belong here: pages and scans stay on the reader.
"""

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

import aiosqlite

from keysvc.db.sqlite.filewatch import FileWatch
from keysvc.db.statements import fetch_all

# Primary result codes of a statement refused because another connection holds a lock.
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class PointReader:
    def __init__(self, conn: sqlite3.Connection, fallback: aiosqlite.Connection, file: FileWatch):
        self.conn = conn
        self._fallback = fallback
        self._file = file

    async def rows(
        self, sql: str, params: Sequence[object], accept: Callable[[list[Any]], bool] = bool
    ) -> list[sqlite3.Row]:
        """Every row of ``sql``, read on the loop; on the fallback's thread when busy.
        One database, so every commit is in it: ``accept`` is not needed."""
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _BUSY_CODES:
                self._file.check()
                raise
        return await fetch_all(self._fallback, sql, params)

    def close(self) -> None:
        self.conn.close()
