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
"""

import logging
import os
from pathlib import Path

from keysvc.errors import DatabaseUnavailable

logger = logging.getLogger("keysvc")

GONE = "database unavailable: its file is no longer where it was opened; nothing was written"


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
        self._lost = False  # as last seen: a line is logged when this changes

    def present(self) -> bool:
        """Whether the path still names the file that was opened (a ``stat``)."""
        here = self._opened is not None and _identity(self._path) == self._opened
        if here == self._lost:
            self._lost = not here
            if self._lost:
                logger.error(
                    "database file %s is no longer the file keysvc opened (removed, moved"
                    " or replaced): writes are refused and /readyz is not ready; put it"
                    " back, or restore it and restart keysvc",
                    self._path,
                )
            else:
                logger.warning("database file %s is back: writes resumed", self._path)
        return here

    def check(self) -> None:
        """Raise ``DatabaseUnavailable`` (503) unless the file opened is still there."""
        if not self.present():
            raise DatabaseUnavailable(GONE)
