"""Whether the database file this process opened is still the one at its path.

SQLite keeps writing to a file it has open even once that file is gone from its
folder: removed (the folder too), moved away or replaced by another. Writes would
then be answered 200 into a file no one will open again, and all of them lost at
the next start. So before a write transaction commits (``Writer.transaction``, the
create batches) and whenever readiness is asked (``Store.schema_is_current``),
``FileWatch`` compares the path's device and inode with those it opened: one
``stat``, a few microseconds, against a commit's fsync. A file that is not the
one opened refuses the write (503 with Retry-After; nothing is committed) and makes
``/readyz`` not ready, until the same file is back at its path (moved back); a
restart is what picks up a file restored from a backup. Reads go on from the
open file meanwhile: they answer what was committed before.

The write-ahead log beside it (``-wal``) is watched the same way: SQLite creates it
at the first connection's first read and keeps that file while any connection is
open, which keysvc's are until it stops, so its device and inode are recorded when
the watch is made (after the store's connections have opened it). Committed writes
sit in the log until a checkpoint copies them into the database file; a log removed
or replaced keeps them only in the file keysvc still holds open. So once a lost log
is noticed (a write's check, before and after it commits, or ``/readyz``), the writer
checkpoints it into the database file (``Writer.keep_lost_wal``): what was acknowledged
is then in the database file, and every later write is refused as above, until
keysvc restarts (SQLite makes a new log then) or the same log is back at its path.

The ``-shm`` file (the WAL index) is what the processes on one database share to agree
on where the log ends. Removed under a serving keysvc, it is harmless to that process,
which keeps the memory it mapped; but a process that opened the database then would
make a new one, and the two would append to one log without seeing each other's
commits (a revocation by ``keysvc revoke-leaked`` acknowledged, never seen by the
server, then written over). So no keysvc process opens a database whose log is there
without its index while another process has it open (``refuse_split_index``).
"""

import fcntl
import logging
import os
import struct
from pathlib import Path

from keysvc.config import ConfigError
from keysvc.errors import DatabaseUnavailable

logger = logging.getLogger("keysvc")

GONE = "database unavailable: its file is no longer where it was opened; nothing was written"


WAL_LOST = (
    "write-ahead log %s is no longer the file keysvc opened (removed or replaced):"
    " writes are refused and /readyz is not ready; restart keysvc"
)


# SQLite's lock bytes in the database file (os_unix.c: PENDING_BYTE, then the shared
# range): every connection in WAL mode holds a read lock there while it is open.
_LOCK_BYTES = (0x40000000, 512)
SPLIT_INDEX = (
    "cannot open the database {path}: its -shm file (the WAL index) is gone while another"
    " process has it open; a process opening it now would write beside that one without"
    " seeing its commits. Restart the keysvc processes serving it first (SQLite makes a"
    " new index then, with nothing lost), then run this again"
)


def _open_elsewhere(path: Path) -> bool:
    """Whether another process holds a lock on the database file's lock bytes (F_GETLK:
    this process's own locks are not reported)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        asked = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, *_LOCK_BYTES, 0)
        found = fcntl.fcntl(fd, fcntl.F_GETLK, asked)
    except OSError:
        return False
    finally:
        os.close(fd)
    return bool(struct.unpack("hhqqi", found)[0] != fcntl.F_UNLCK)


def refuse_split_index(path: Path) -> None:
    """ConfigError when the database at ``path`` has its write-ahead log without its
    ``-shm`` index and another process has it open (see the module)."""
    real = Path(os.path.realpath(path))
    wal, shm = (real.with_name(real.name + suffix) for suffix in ("-wal", "-shm"))
    if shm.exists() or not wal.exists():
        return
    if _open_elsewhere(real):
        raise ConfigError(SPLIT_INDEX.format(path=path))


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_dev, found.st_ino


class FileWatch:
    """The device and inode of the database file as opened, and whether its path
    still names that file."""

    def __init__(self, path: Path):
        self._path = path
        self._opened = _identity(path)
        self._wal = path.with_name(path.name + "-wal")
        self._wal_opened = _identity(self._wal)
        self._lost = False  # as last seen: a line is logged when this changes
        self._main_seen = self._opened is not None  # the database file, as last seen
        # Whether the lost log's writes were copied into the database file.
        self._wal_saved = False

    def _wal_here(self) -> bool:
        """Whether the log at its path is the one opened (recorded when first seen)."""
        found = _identity(self._wal)
        if self._wal_opened is None:
            self._wal_opened = found
        return found == self._wal_opened

    def wal_to_save(self) -> bool:
        """Whether the database file is here but its log is lost, and not yet
        checkpointed into it (``Writer.keep_lost_wal`` does, then calls ``wal_saved``)."""
        return not self.present() and self._main_seen and not self._wal_saved

    def wal_saved(self) -> None:
        self._wal_saved = True

    def present(self) -> bool:
        """Whether the path, and its log's, still name the files opened (``stat``s)."""
        self._main_seen = self._opened is not None and _identity(self._path) == self._opened
        here = self._main_seen and self._wal_here()
        if here == self._lost:
            self._lost = not here
            if here:
                self._wal_saved = False
                logger.warning("database file %s is back: writes resumed", self._path)
            elif self._main_seen:
                logger.error(WAL_LOST, self._wal)
            else:
                logger.error(
                    "database file %s is no longer the file keysvc opened (removed, moved"
                    " or replaced): writes are refused and /readyz is not ready; put it"
                    " back, or restore it and restart keysvc",
                    self._path,
                )
        return here

    def check(self) -> None:
        """Raise ``DatabaseUnavailable`` (503) unless the file opened is still there."""
        if not self.present():
            raise DatabaseUnavailable(GONE)
