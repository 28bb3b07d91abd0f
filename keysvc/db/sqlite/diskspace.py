"""What a full disk does to writes: the error the caller gets, the log line the
operator gets, and the state readiness reports.

SQLite answers a write it cannot store with ``SQLITE_FULL`` and writes nothing:
the transaction is rolled back whole, what was committed before stays intact,
and reads go on working. So a full disk is not an internal error. The request
gets ``InsufficientStorage`` (507, "database disk is full"); the log gets one
short line, not a traceback per request, and at most one every
``LOG_INTERVAL_SECONDS`` while the disk stays full, counting the writes refused
since the last; and ``/readyz`` says not ready while the filesystem has less
than ``ROOM_BYTES`` free, in every worker. A write that changes nothing would not
tell: SQLite reuses space its write-ahead log already holds, so one small write
may pass where a create cannot. Nothing here stops writes: the next one is tried
as usual, so writes resume by themselves once there is space.
"""

import logging
import os
import sqlite3
import time
from pathlib import Path

from keysvc.errors import DatabaseUnavailable, InsufficientStorage

logger = logging.getLogger("keysvc")

# At most one "disk is full" line this often, however many writes are refused.
LOG_INTERVAL_SECONDS = 10.0
# Free space on the database's filesystem that counts as room again after a full
# disk: a write needs room for its write-ahead log frames, a checkpoint room for the
# database file to grow.
ROOM_BYTES = 1 << 20


# What a write answers when another process held the database's write lock for all of
# the busy timeout: SQLite refused it whole, so nothing was written (rt52 F2: a 500).
LOCKED = "the database is locked: another process holds its write lock"


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (busy, or locked within its
    shared cache), which leaves nothing written."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.Error)
        and code is not None
        and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    )


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database or disk is full"."""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == sqlite3.SQLITE_FULL
    )


class DiskSpace:
    """What the store's writes found, as they report it: whether the last one found the
    disk full, and when one last found another process's write lock held past the busy
    timeout (``locked_at``)."""

    def __init__(self, db_path: Path) -> None:
        self._where = db_path.parent
        self.full = False
        self._refused = 0  # writes refused since the last line
        self._logged_at: float | None = None
        # When a write last waited out the busy timeout (time.monotonic), if one has.
        self.locked_at: float | None = None

    def failed(self, exc: Exception) -> Exception:
        """What a write that raised ``exc`` raises in turn: ``InsufficientStorage`` for
        a full disk (counted, and logged now and then), ``DatabaseUnavailable`` for a
        write lock held past the busy timeout, anything else as it is."""
        if is_busy(exc):
            self.locked_at = time.monotonic()
            return DatabaseUnavailable(LOCKED)
        if not is_disk_full(exc):
            return exc
        self.full = True
        self._refused += 1
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= LOG_INTERVAL_SECONDS:
            logger.error(
                "database disk is full: %d write(s) refused; writes resume once there is space",
                self._refused,
            )
            self._logged_at, self._refused = now, 0
        return InsufficientStorage()

    def locked_since(self, moment: float) -> bool:
        """Whether a write waited out the busy timeout after ``moment``: another process
        held the write lock then, and a write that was waiting behind it for this
        process's turn is refused at once rather than wait the timeout again (rt53 R1:
        the Nth write queued under a held lock was answered after N times the timeout)."""
        return self.locked_at is not None and self.locked_at > moment

    def succeeded(self) -> None:
        """A write committed: the disk has room again."""
        if self.full:
            self.full = False
            self._logged_at, self._refused = None, 0
            logger.warning("database disk has space again: writes resumed")

    def ready(self) -> bool:
        """False while the filesystem has less than ``ROOM_BYTES`` free, whichever
        process's writes found it full (or none yet: each worker has its own flag);
        true again once there is room."""
        try:
            stat = os.statvfs(self._where)
        except OSError:
            return not self.full
        return stat.f_bavail * stat.f_frsize >= ROOM_BYTES
