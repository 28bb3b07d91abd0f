"""Has anything been committed since I last looked, and has authorization moved? Asked on
every request, cheaply: ``Freshness`` answers with the database's ``data_version`` and
the ``auth_generation`` (read only when the version has moved). ``CommitWatch`` maps
the WAL-index header of the ``-shm`` file read-only and asks ``PRAGMA data_version``
only when its bytes change.

One hazard shapes the code: closing any descriptor of the ``-shm`` file drops the
process's POSIX locks on it, so the mapping stays open until ``close``, after every
connection of the store (``tests/system/test_walwatch.py``). The whole reasoning and
its measurements: docs/PERFORMANCE.md, "Design notes".
"""

import mmap
import os
import sqlite3
import struct
from pathlib import Path
from typing import ClassVar

from keysvc.db.meta import GENERATION

# The first field of the WAL-index header: the WAL-index format version, 3007000
# since SQLite 3.7.0, in the machine's byte order.
WAL_INDEX_VERSION = 3007000
HEADER_BYTES = 48


class _SharedIndex:
    """One process's read-only mapping of one ``-shm`` file, shared by every
    ``CommitWatch`` on that database and closed with the last of them."""

    _open: ClassVar["dict[Path, _SharedIndex]"] = {}

    def __init__(self, path: Path, fd: int, mapping: mmap.mmap | None):
        self.path, self.fd, self.mapping, self.users = path, fd, mapping, 0

    @classmethod
    def acquire(cls, db_path: Path) -> "_SharedIndex | None":
        # SQLite follows symbolic links to name the database, and so its -shm file.
        real = Path(os.path.realpath(db_path))
        shm = real.with_name(real.name + "-shm")
        shared = cls._open.get(shm)
        if shared is None:
            try:
                fd = os.open(shm, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            mapping: mmap.mmap | None
            try:
                mapping = mmap.mmap(fd, HEADER_BYTES, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                mapping = None  # the descriptor is kept all the same: see the note above
            shared = cls._open[shm] = cls(shm, fd, mapping)
        shared.users += 1
        return shared

    def release(self) -> None:
        self.users -= 1
        if self.users == 0:
            del self._open[self.path]
            if self.mapping is not None:
                self.mapping.close()
            os.close(self.fd)


class CommitWatch:
    """The database's ``data_version``, from the WAL-index header where it can be."""

    def __init__(self, conn: sqlite3.Connection, db_path: Path | None):
        self._conn = conn
        self._seen_header = b""
        self._version = self._ask()  # opens the WAL index, so the -shm file exists
        self._index = _SharedIndex.acquire(db_path) if db_path is not None else None
        self._map: mmap.mmap | None = None  # the mapping, if it holds a WAL index
        mapping = self._index.mapping if self._index is not None else None
        if mapping is not None and struct.unpack("=I", mapping[:4])[0] == WAL_INDEX_VERSION:
            self._map = mapping

    @property
    def mapped(self) -> bool:
        """Whether the header is being read (False: every call asks the pragma)."""
        return self._map is not None

    def version(self) -> int:
        """A number that moves whenever any connection, in any process, commits."""
        if self._map is None:
            self._version = self._ask()
            return self._version
        header = self._map[:HEADER_BYTES]
        if header != self._seen_header:
            self._version = self._ask()
            self._seen_header = header
        return self._version

    def _ask(self) -> int:
        version: int = self._conn.execute("pragma data_version").fetchone()[0]
        return version

    def close(self) -> None:
        """Let go of the mapping; the last watcher of a database in this process
        unmaps and closes it, so call this only after the connections are closed."""
        self._map = None
        if self._index is not None:
            self._index.release()
            self._index = None


class Freshness:
    """The watcher connection, a synchronous one used on the event loop only for
    ``data_version`` and the authorization generation."""

    def __init__(self, watcher: sqlite3.Connection, db_path: Path):
        self._watcher = watcher
        self._commits = CommitWatch(watcher, db_path)
        self._seen_version = -1
        # The authorization generation as of the last version looked at.
        self.generation: object = None

    def look(self) -> int:
        """``data_version`` now; ``generation`` is brought up to date with it.

        Runs without a thread hop or a statement while nothing has been committed
        (``CommitWatch``); the generation is read only when some connection has
        committed since the last look.
        """
        version = self._commits.version()
        if version != self._seen_version:
            row = self._watcher.execute(GENERATION).fetchone()
            self.generation = row[0] if row else None
            self._seen_version = version
        return version

    def close_connection(self) -> None:
        self._watcher.close()

    def release(self) -> None:
        """Let go of the WAL index: only once every connection of the store is closed."""
        self._commits.close()
