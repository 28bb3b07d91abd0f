"""Reads on hot standbys of the primary (``--pg-replicas``): ``RoutedReader``, which
answers the store's reads outside a transaction (``StoreCore``'s reader and point
reader) on a replica when that is as fresh as the primary for everything this
instance knows of, and on the primary otherwise. Writes, and every read inside a
write transaction (credits, the domain's checks), never come here: they run on the
primary's pool (``PgWriter``); so do the shared limits, the background tasks' reads
and ``/readyz``.

The rules, in order:

- A read may go to a replica only once that replica has replayed past the newest
  change position this instance knows (``Notifications.known_position``: the WAL
  insert position read after every commit it made or heard of, and with every
  authorization generation it read). While a commit heard of is not yet covered by
  a position read, or notifications are not heard (the caches are cold then too),
  every read goes to the primary.
- A replica's replay position (``pg_last_wal_replay_lsn()``) is read every
  CHECK_SECONDS, and again at once (one read in flight per replica) when a read
  needs more than the last one showed; that read goes to the primary meanwhile. The
  replay position only moves forward while the server runs; a pooled connection to
  a server started again since the last check (``pg_postmaster_start_time()``) is
  refused, and the replica left out until the next check.
- A read that finds nothing on a replica is asked of the primary, as a cache miss
  is: a key, webhook or activity created through another instance whose commit this
  one has not heard of yet is found there (read-your-writes through any instance).
  A failed credential check is asked of the primary too, found or not
  (``StoreCore.find_credential``).
- A replica of another cluster (its ``pg_control_system()`` system identifier is not
  the primary's: another deployment's standby, a copy restored elsewhere) is left out
  whatever it has replayed, and so are pooled connections to any server but the one
  its last check read: its positions say nothing of the primary's changes.
- A replica's connections carry no session setting (a standby runs no trigger to
  quiet, and a pooler such as PgBouncer refuses a startup parameter it does not
  know), and, with ``--pg-listen-url`` (``--db`` through a pooler), keep no statement
  prepared: replicas may sit behind a pooler in transaction mode too.
- A replica that does not answer within CHECK_TIMEOUT, is no longer in recovery
  (promoted), or lags more than ``--pg-replica-max-lag`` behind the primary is left
  out, logged once, until a check finds it well again, logged once more. A read
  that fails on a replica is read again on the primary: never a 503 for a replica.

Why revocation keeps its bound: a write that moves the authorization generation
returns only once every other instance has acknowledged it (``Notifications``), and
an instance acknowledges a generation only after reading it together with the
position, so from the next request on, no instance reads a replica that has not
replayed the change (docs/SECURITY.md).
"""

import asyncio
import bisect
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from keysvc.db.contract import Accept
from keysvc.db.postgres.connection import (
    CONNECT_SECONDS,
    UNAVAILABLE,
    Done,
    PgConnection,
    acquired,
    keep_session,
)
from keysvc.db.postgres.reader import PgReader

logger = logging.getLogger("keysvc")
# A replica's reason before its first check: its first verdict is logged, either way.
NOT_CHECKED = "not checked yet"

# How often each replica's state is read, and how long that read may take.
CHECK_SECONDS = 1.0
CHECK_TIMEOUT = 1.0
# A read on a replica, its pooled connection's wait included: past it, the primary.
READ_SECONDS = 2.0
# The primary's write positions kept to measure lag: one per check.
SAMPLES_KEPT = 300
# A position as a number (bytes since 0/0): pg_lsn has no codec in asyncpg's defaults.
_NUMBER = "(({}) - '0/0'::pg_lsn)::bigint"
# The cluster a server belongs to: made by initdb, kept by pg_basebackup and its
# standbys, another for any other cluster (a copy restored by pg_dump included).
_SYSTEM = "(select system_identifier from pg_control_system())"
# Which server a connection reached: the cluster, and when its server started.
_SERVER = "select " + _SYSTEM + ", pg_postmaster_start_time()"
_STATE = (
    "select pg_is_in_recovery(), "
    + _NUMBER.format("pg_last_wal_replay_lsn()")
    + ", "
    + _SYSTEM
    + ", pg_postmaster_start_time()"
)
_REPLAYED = "select " + _NUMBER.format("pg_last_wal_replay_lsn()")
# The primary's write position: the end of the last record written, what a replica
# that has replayed everything shows; and its cluster.
_WRITTEN = "select " + _NUMBER.format("pg_current_wal_lsn()") + ", " + _SYSTEM
PRIMARY = "primary"


class Restarted(Exception):
    """A replica's server was started again since its last check, or is another."""


def replica_name(url: str) -> str:
    """A replica as metrics and logs name it: host and port, never its credentials."""
    parts = urlsplit(url)
    return f"{parts.hostname or 'localhost'}:{parts.port or 5432}"


class Replica:
    """One hot standby: its pool, and what its last check found."""

    def __init__(self, url: str, max_lag: float, pooled: bool = False):
        self.url = url
        # Through a pooler in transaction mode: no statement kept prepared (the next
        # transaction may run on another server connection).
        self._session: dict[str, Any] = {"statement_cache_size": 0} if pooled else {}
        self.name = replica_name(url)
        self.max_lag = max_lag
        self.usable = False
        self.reason = NOT_CHECKED
        # Its replay position at its last check (-1: unknown), and how far behind the
        # primary it was then (seconds).
        self.replayed = -1
        self.lag = 0.0
        self.reads = 0
        # The server its last check reached (cluster, start time); None: none yet.
        self._server: tuple[object, object] | None = None
        self._conn: Any = None
        self._refreshing: asyncio.Task[None] | None = None
        self.pool: Any = None

    async def open(self) -> None:
        # min_size 0: a replica down at start costs no start-up failure.
        self.pool = await asyncpg.create_pool(
            self.url,
            min_size=0,
            max_size=10,
            init=self._same_server,
            reset=keep_session,
            timeout=CONNECT_SECONDS,
            command_timeout=READ_SECONDS,
            **self._session,
        )

    async def _same_server(self, conn: Any) -> None:
        """A new pooled connection: refused unless to the server the last check read
        (its replay position is known only for the server's lifetime, and the check
        found it a standby of the primary)."""
        server = tuple(await conn.fetchrow(_SERVER))
        if self._server is None or server != self._server:
            raise Restarted(f"{self.name} is not the server its last check read")

    def _set(self, usable: bool, reason: str) -> None:
        if usable and not self.usable:
            logger.warning("PostgreSQL replica %s back in: reads may use it", self.name)
        elif not usable and (self.usable or self.reason == NOT_CHECKED):
            logger.warning(
                "PostgreSQL replica %s left out (%s); its reads go to the primary",
                self.name, reason,
            )  # fmt: skip
        elif not usable and reason != self.reason:  # the same outage, seen another way
            logger.debug("PostgreSQL replica %s still left out (%s)", self.name, reason)
        self.usable, self.reason = usable, reason

    def failed(self, exc: BaseException) -> None:
        """A read on it failed: left out when the server is the cause."""
        if isinstance(exc, (*UNAVAILABLE, Restarted)):
            self._set(False, f"a read failed: {type(exc).__name__}")
        else:
            logger.debug("a read on replica %s failed: %s", self.name, type(exc).__name__)

    async def check(self, samples: "Samples", system: int | None) -> None:
        """Read its state on a connection of its own; left out or taken back by it.
        ``system``: the primary's cluster (None: not known yet); a server of another
        is left out whatever it has replayed."""
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self.url, timeout=CHECK_TIMEOUT, **self._session)
            async with asyncio.timeout(CHECK_TIMEOUT):
                recovering, replayed, cluster, started = await self._conn.fetchrow(_STATE)
        except Exception as exc:
            self._drop()
            self._set(False, f"down: {type(exc).__name__}")
            return
        if (cluster, started) != self._server:
            self._server = cluster, started
            self.replayed = -1
        if system is None:
            self._set(False, "the primary's cluster not read yet")
            return
        if cluster != system:
            self._set(False, "not a standby of the primary: another cluster's server")
            return
        if not recovering or replayed is None:
            self._set(False, "not a standby: promoted, or never one")
            return
        self.replayed = max(self.replayed, int(replayed))
        self.lag = samples.lag(self.replayed)
        if self.lag > self.max_lag:
            self._set(False, f"lagging {self.lag:.1f} s behind the primary")
        else:
            self._set(True, "")

    def refresh(self) -> None:
        """Read its replay position again now (one read in flight at a time)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh(), name="keysvc-replica")

    async def _refresh(self) -> None:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT), self.pool.acquire() as raw:
                replayed = await raw.fetchval(_REPLAYED)
        except Exception as exc:
            self.failed(exc)
            return
        if replayed is not None:
            self.replayed = max(self.replayed, int(replayed))

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)
        self._drop()
        if self.pool is not None:
            try:
                async with asyncio.timeout(CHECK_TIMEOUT):
                    await self.pool.close()
            except TimeoutError:
                self.pool.terminate()


class Samples:
    """The primary's write position at each check, to tell how far behind a replica's
    replay position is in time: it holds everything the primary had written at the
    newest sample not past it."""

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=SAMPLES_KEPT)
        self._positions: deque[int] = deque(maxlen=SAMPLES_KEPT)

    def add(self, position: int) -> None:
        if self._positions and position < self._positions[-1]:
            self._times.clear()  # another primary (a failover): start again
            self._positions.clear()
        self._times.append(time.monotonic())
        self._positions.append(position)

    def lag(self, replayed: int) -> float:
        """Seconds behind: 0 when past the newest sample."""
        if not self._positions or replayed >= self._positions[-1]:
            return 0.0
        at = bisect.bisect_right(self._positions, replayed) - 1
        since = self._times[at] if at >= 0 else self._times[0]
        return time.monotonic() - since


class RoutedReader:
    """The store's reader and point reader, on a replica when the rules allow (see the
    module), else on the primary's (``PgReader``)."""

    in_transaction = False

    def __init__(
        self,
        primary: PgReader,
        pool: Any,
        urls: tuple[str, ...],
        max_lag: float,
        position: Callable[[], int | None],
        pooled: bool = False,
    ):
        self._primary = primary
        self._pool = pool
        self._position = position
        self.replicas = [Replica(url, max_lag, pooled) for url in urls]
        self.primary_reads = 0
        self._next = 0
        self._samples = Samples()
        # The primary's system identifier, once read.
        self._system: int | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for replica in self.replicas:
            await replica.open()
        await self._check_all()
        self._task = asyncio.create_task(self._watch(), name="keysvc-replicas")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            await self._check_all()

    async def _check_all(self) -> None:
        try:
            async with asyncio.timeout(CHECK_TIMEOUT), self._pool.acquire() as raw:
                written, self._system = await raw.fetchrow(_WRITTEN)
            self._samples.add(int(written))
        except Exception as exc:  # the primary's own trouble is answered elsewhere
            logger.debug("could not read the primary's position: %s", type(exc).__name__)
        system = self._system
        await asyncio.gather(*(replica.check(self._samples, system) for replica in self.replicas))

    def _pick(self) -> Replica | None:
        """A replica fresh enough for everything this instance knows of, or None."""
        needed = self._position()
        if needed is None:
            return None
        count = len(self.replicas)
        for step in range(count):
            replica = self.replicas[(self._next + step) % count]
            if not replica.usable:
                continue
            if replica.replayed >= needed:
                self._next = (self._next + step + 1) % count
                return replica
            replica.refresh()
        return None

    async def _on_replica(self, replica: Replica, sql: str, params: Any) -> list[Any] | None:
        """The rows from ``replica``; None when it failed (then read on the primary)."""
        try:
            async with acquired(replica.pool, None, READ_SECONDS) as raw:
                rows = await PgConnection(raw, READ_SECONDS).execute_fetchall(sql, params)
        except Exception as exc:
            replica.failed(exc)
            return None
        replica.reads += 1
        return rows

    async def execute_fetchall(self, sql: str, params: Any = ()) -> list[Any]:
        """Any read: one that finds nothing on a replica is asked of the primary, as a
        point read is (a webhook or activity made through another instance)."""
        return await self.rows(sql, params)

    async def rows(self, sql: str, params: Any, accept: Accept = bool) -> list[Any]:
        """A read whose rows from a replica ``accept`` refuses (by default, none found)
        is asked of the primary."""
        replica = self._pick()
        if replica is not None:
            rows = await self._on_replica(replica, sql, params)
            if rows is not None and accept(rows):
                return rows
        self.primary_reads += 1
        return await self._primary.rows(sql, params)

    async def execute(self, sql: str, params: Any = ()) -> Done:
        return await self._primary.execute(sql, params)

    async def executemany(self, sql: str, params: Any) -> None:
        await self._primary.executemany(sql, params)

    def reads(self) -> dict[str, int]:
        """Reads answered so far, by target (the primary, each replica by name)."""
        return {PRIMARY: self.primary_reads, **{r.name: r.reads for r in self.replicas}}

    def lags(self) -> dict[str, tuple[bool, float]]:
        """Each replica: whether reads may use it, and its lag at its last check."""
        return {r.name: (r.usable, r.lag) for r in self.replicas}

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for replica in self.replicas:
            await replica.close()
