"""Writes that wait to share a transaction, on either backend: usedAt, the usage
counts and the uses of revoked keys (SQLite's key creates are
``keysvc.db.sqlite.createbatch``'s).

usedAt writes that arrive together share one transaction: at the turn of a minute
every busy key writes at once. The usage counts (``keysvc.db.usage``) ride in that
transaction, or in one of their own when ``write_counts`` is called (every flush
interval, and at close): no request waits for them. A revoked key's use is logged at
most once a minute per key, and off the request's path: a client hammering with a
disabled key's credentials costs no write per request.
"""

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from keysvc.db import activities as activity_sql
from keysvc.db import keys as key_sql
from keysvc.db import outbox
from keysvc.db import usage as usage_sql
from keysvc.db.contract import RevokedUse, Writes
from keysvc.db.seal import Seal
from keysvc.errors import InsufficientStorage
from keysvc.logs import log_failure
from keysvc.models import Key
from keysvc.timeutil import to_minute, to_text

logger = logging.getLogger("keysvc")


@dataclass
class _PendingTouches:
    """usedAt writes waiting for the next transaction (key UUID -> minute), and the
    future that every request waiting on one of them shares."""

    minutes: dict[str, str]
    done: "asyncio.Future[None]" = field(repr=False)


class Touches:
    """usedAt writes: which keys this process has written this minute, and those
    waiting for the next transaction; and this process's usage counts (``tally``),
    written in the same transactions."""

    def __init__(self, writer: Writes):
        self._writer = writer
        self.tally = usage_sql.Tally()
        # Keys whose usedAt this process has written for the minute in _touched_minute.
        self._touched: set[str] = set()
        self._touched_minute: datetime | None = None
        self._touches: _PendingTouches | None = None
        self.flusher: asyncio.Task[None] | None = None

    def needs_touch(self, key: Key, minute: datetime) -> bool:
        """Whether ``key``'s usedAt is behind ``minute``, as far as this process knows.

        A cached record keeps the usedAt it was read with, so the keys written
        this minute are remembered here; the set starts again each minute.
        """
        if key.used_at is not None and key.used_at >= minute:
            return False
        return minute != self._touched_minute or key.id not in self._touched

    async def touch(self, key_id: str, minute: datetime) -> None:
        """Set usedAt to ``minute`` unless it is already there (at most one write a minute).

        Answered once committed. On a full disk it is answered unwritten, and a
        later request tries again.
        """
        if minute != self._touched_minute:
            self._touched, self._touched_minute = set(), minute
        self._touched.add(key_id)
        touches = self._touches
        if touches is None:
            touches = self._touches = _PendingTouches(
                {}, asyncio.get_running_loop().create_future()
            )
        touches.minutes[key_id] = to_text(minute)
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush())
        try:
            await asyncio.shield(touches.done)
        except InsufficientStorage:
            # usedAt is not worth refusing a request for: it is written by a later one.
            self._touched.discard(key_id)

    async def write_counts(self) -> None:
        """Write the usage counts of this process now (with any usedAt waiting), unless
        a flush under way takes them. A failed write keeps them for the next call.

        The flush is waited for, never cancelled with its caller (``Store.close``
        cancels the upkeep that calls this): cancelled in its commit, it could not
        tell whether its counts were written, and the counts it gave back would be
        written again."""
        running = self.flusher
        if running is not None and not running.done():
            await asyncio.wait((running,))
        if self.tally or self._touches is not None:
            self.flusher = asyncio.create_task(self._flush())
            await asyncio.wait((self.flusher,))

    async def _flush(self) -> None:
        # The counts are written by the first transaction (and join any later one for
        # usedAt): gone on while counts were waiting, a flush would never end under
        # steady traffic, each commit making every cache read again what it holds.
        # After a failed write they wait for write_counts: retried here, a full disk
        # would be retried without end.
        counts_wanted = True
        while self._touches is not None or (self.tally and counts_wanted):
            counts_wanted = False
            touches = None
            counts: usage_sql.Counts = {}
            try:
                async with self._writer.transaction() as conn:
                    # Taken once the lock is held: touches that came meanwhile join in.
                    touches, self._touches = self._touches, None
                    counts = self.tally.take()
                    if touches is not None:
                        await key_sql.write_used_at(conn, touches.minutes)
                    if counts:
                        await usage_sql.add_counts(conn, counts)
            except Exception as exc:
                self.tally.give_back(counts)
                if touches is None:  # failed before taking them: they fail all the same
                    touches, self._touches = self._touches, None
                if touches is not None and not touches.done.done():
                    touches.done.set_exception(exc)
                    touches.done.exception()  # retrieved, should every waiter be gone
                continue
            except BaseException:
                self.tally.give_back(counts)
                # Cancelled: the waiters must not hang on a future nobody will settle.
                pending = [t for t in (touches, self._touches) if t is not None]
                self._touches = None
                for waiting in pending:
                    if not waiting.done.done():
                        waiting.done.cancel()
                raise
            if touches is not None:
                touches.done.set_result(None)


class RevokedUses:
    """Uses of revoked keys waiting to be logged, at most one per key a minute, and
    the task that writes them in one transaction."""

    def __init__(self, writer: Writes, chain: activity_sql.Chain, seal: Seal):
        self._writer = writer
        self._chain = chain
        self._seal = seal
        # Keys whose use was logged (or is waiting) in the minute of _minute.
        self._noted: set[str] = set()
        self._minute: datetime | None = None
        self._pending: list[RevokedUse] = []
        self.flusher: asyncio.Task[None] | None = None

    def note(self, key_id: str, moment: datetime, make: Callable[[], "RevokedUse"]) -> None:
        """Record the activity ``make`` returns and send its ``key.used_after_revoke``
        event, unless this key's use was noted this minute already: then nothing is
        made, let alone written."""
        minute = to_minute(moment)
        if minute != self._minute:
            self._noted, self._minute = set(), minute
        if key_id in self._noted:
            return
        self._noted.add(key_id)
        self._pending.append(make())
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._pending:
            try:
                async with self._writer.transaction() as conn:
                    # Taken once the lock is held: uses noted meanwhile join in.
                    pending, self._pending = self._pending, []
                    for use in pending:
                        activity = use.activity
                        await activity_sql.record(conn, self._chain, activity)
                        await outbox.enqueue(
                            conn, self._seal, self._chain.quota, activity.organization_id,
                            "key.used_after_revoke", use.key_view, activity.created_at,
                        )  # fmt: skip
            except InsufficientStorage:
                self._pending = []  # the full disk has its own log line (sqlite.diskspace)
            except Exception:
                # Not worth more than a log line: the key was refused all the same,
                # and its next use after this minute is noted again.
                self._pending = []  # dropped rather than retried in a loop
                log_failure(logger, "could not record the use of a revoked key")
