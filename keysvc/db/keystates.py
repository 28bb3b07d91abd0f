"""The counts behind the ``keysvc_keys`` gauge: keys by effective state.

Counting scans every key, so it is kept away from the requests that matter: it
runs on a connection and a thread of its own, never on the store's reader,
which authentication waits on; at most once per ``every`` of the app's clock,
the counts in between being those of the last count; and scrapes that arrive
while a count runs wait for that count rather than start another. "Expired"
moves with time, so the gauge may be up to ``every`` behind it, as behind
writes.

The SQL is ``keysvc.db.keys.count_keys_by_state``'s; this module owns when it runs
and where. The store hands one out (``Store.key_counts``).
"""

import asyncio
import logging
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from keysvc.db.keys import count_keys_by_state, count_keys_by_state_on
from keysvc.db.sqlite.connections import connect_now
from keysvc.db.timing import Observer
from keysvc.errors import DatabaseUnavailable, ServiceUnavailable

logger = logging.getLogger("keysvc")

Counts = dict[str, int]
# The name the count is reported under, as the store method it used to be.
OPERATION = "count_keys_by_state"


class KeyStates:
    def __init__(
        self,
        path: Path | None,
        *,
        every: timedelta,
        observer: Observer | None = None,
        reader: Any = None,
    ):
        """``reader``: count there instead (PostgreSQL's pool), not on a connection of
        this module's own to the file at ``path``."""
        self._path = path
        self._reader = reader
        self._every = every
        self.observer = observer
        # One thread, which alone opens, uses and closes the connection.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="keysvc-keystates")
        self._conn: sqlite3.Connection | None = None
        self._last: tuple[datetime, Counts] | None = None
        self._running: asyncio.Task[Counts] | None = None
        self._closed = False

    async def counts(self, now: datetime) -> Counts:
        """The counts as of a count made at most ``every`` before ``now``."""
        last = self._last
        if last is not None and timedelta(0) <= now - last[0] < self._every:
            return last[1]
        if self._closed:
            raise ServiceUnavailable("the database is closed: the server is stopping")
        running = self._running
        if running is None:
            running = self._running = asyncio.create_task(self._count(now))
            running.add_done_callback(_retrieved)
        # Shielded: a scrape that gives up does not cancel the count others wait for.
        return await asyncio.shield(running)

    async def _count(self, now: datetime) -> Counts:
        started = time.perf_counter()
        try:
            if self._reader is not None:
                counts = await count_keys_by_state_on(self._reader, now)
            else:
                loop = asyncio.get_running_loop()
                counts = await loop.run_in_executor(self._thread, self._count_on_thread, now)
        finally:
            self._running = None
            if self.observer is not None:
                self.observer(OPERATION, time.perf_counter() - started)
        self._last = (now, counts)
        return counts

    def _count_on_thread(self, now: datetime) -> Counts:
        """A SQLite file that cannot be opened (its folder gone, say: ``connect_now``
        makes no new one) or read is the database not answering: DatabaseUnavailable."""
        try:
            if self._conn is None:
                assert self._path is not None  # counted on ``reader`` otherwise
                self._conn = connect_now(self._path)
            return count_keys_by_state(self._conn, now)
        except sqlite3.OperationalError as exc:
            logger.warning("the key counts' database does not answer: %s", exc)
            raise DatabaseUnavailable("the database does not answer") from None

    async def close(self) -> None:
        """Wait for a count under way, then close the connection and end the thread."""
        self._closed = True
        running = self._running
        if running is not None:
            await asyncio.wait([running])
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close_on_thread)
        self._thread.shutdown(wait=True)

    def _close_on_thread(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _retrieved(count: "asyncio.Task[Counts]") -> None:
    """Mark a failed count's error as seen: every scrape waiting on it may have gone."""
    if not count.cancelled():
        count.exception()
