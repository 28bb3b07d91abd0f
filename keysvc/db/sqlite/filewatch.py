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
server, then written over); so would one after a reader (``keysvc backup``) made a new
index at the path that the server does not use. So each serving keysvc marks the
database open (``mark_open``), and no keysvc process opens a database that another
process serves through an index no longer at its path (``refuse_split_index``).
"""

import contextlib
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


# SQLite's lock bytes (os_unix.c): the DMS byte of the -shm file (UNIX_SHM_DMS), which
# every process using that index read-locks while it is open. And a byte of the
# database file's lock page that SQLite never locks (its own are the 512 from
# PENDING_BYTE, 0x40000000): each serving keysvc read-locks it, with a lock of its open
# file description (F_OFD_SETLK) that no other descriptor's close drops, so that
# another process can tell the database is open (SQLite's own locks on the file come
# and go with each transaction); and its write-ahead log's first byte, which SQLite
# never locks, so that another process can tell it is the log in use.
_INDEX_LOCK = (128, 1)
_OPEN_MARK = (0x40000000 + 1024, 1)
_LOG_MARK = (0, 1)
_FLOCK = "hhqqi"
# The databases this process opened (real path -> descriptors it keeps): closing any
# descriptor of a file drops every POSIX lock this process holds on it, SQLite's
# included, so the database file's and its log's are opened once, before SQLite's,
# and closed only by ``unmark``, after SQLite's.
_kept: dict[Path, list[int]] = {}
# How many stores of this process have the database open (``mark_open``).
_users: dict[Path, int] = {}
SPLIT_INDEX = (
    "cannot open the database {path}: its -shm file (the WAL index) or its -wal is gone"
    " while another process serves it (removed, or made again by a process that did not"
    " share them); a process opening it now would write beside that one without seeing"
    " its commits. Restart the keysvc processes serving it first (SQLite makes a new"
    " index then, with nothing lost), then run this again"
)


def _real(path: Path) -> Path:
    # SQLite follows symbolic links to name the database, and so its -wal and -shm.
    return Path(os.path.realpath(path))


def _beside(real: Path, suffix: str) -> Path:
    return real.with_name(real.name + suffix)


def _lock_on(fd: int, lock: tuple[int, int]) -> bool:
    """Whether a lock that another process, or another open file description, holds
    covers the bytes ``lock`` (start, length) of the file open at ``fd`` (F_GETLK)."""
    try:
        asked = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, *lock, 0)
        found = fcntl.fcntl(fd, fcntl.F_GETLK, asked)
    except OSError:
        return False
    return bool(struct.unpack(_FLOCK, found)[0] != fcntl.F_UNLCK)


def _locked_elsewhere(path: Path, lock: tuple[int, int]) -> bool:
    """``_lock_on`` a file opened for the question; only for a file this process holds
    no lock on (its -wal, which SQLite never locks; its -shm, before SQLite opens it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return _lock_on(fd, lock)
    finally:
        os.close(fd)


def _keep(real: Path, name: Path) -> int | None:
    """A descriptor of ``name`` kept until ``unmark``."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    _kept.setdefault(real, []).append(fd)
    return fd


def mark_open(path: Path) -> None:
    """Say, for as long as this process serves the database at ``path``, that it has it
    open and which log it uses (released by ``unmark``, once every connection is
    closed). Where open file description locks are missing (not Linux), nothing is
    marked, and ``refuse_split_index`` refuses nothing."""
    real = _real(path)
    _users[real] = _users.get(real, 0) + 1
    setlk = getattr(fcntl, "F_OFD_SETLK", None)
    kept = _kept.get(real, [])
    if setlk is None or len(kept) != 1:
        return  # not checked first, or marked already
    for fd, mark in ((kept[0], _OPEN_MARK), (_keep(real, _beside(real, "-wal")), _LOG_MARK)):
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(fd, setlk, struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, *mark, 0))


def unmark(path: Path) -> None:
    """The end of a ``mark_open``: the last store of the process lets the marks go."""
    real = _real(path)
    _users[real] = _users.get(real, 1) - 1
    if _users[real] <= 0:
        del _users[real]
        _forget(real)


def _forget(real: Path) -> None:
    for fd in _kept.pop(real, []):
        os.close(fd)


def refuse_split_index(path: Path) -> None:
    """ConfigError when another process serves the database at ``path`` (its mark) and
    the ``-shm`` or ``-wal`` at its path is not the one that process uses: absent, or
    made again since by a process that did not share it (see the module). Asked once
    per process, before its first connection: the later ones share its index."""
    real = _real(path)
    if real in _kept:
        return
    fd = _keep(real, real)
    if fd is None or not _lock_on(fd, _OPEN_MARK):
        return
    if not (
        _locked_elsewhere(_beside(real, "-wal"), _LOG_MARK)
        and _locked_elsewhere(_beside(real, "-shm"), _INDEX_LOCK)
    ):
        _forget(real)  # before any connection of this process's: no lock of SQLite's
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
