"""SQLite's part of ``keysvc backup``: the copy, by SQLite's backup API in one step
inside one read transaction (in WAL mode a snapshot, while the server goes on
writing), made one self-contained file, then checked (``PRAGMA integrity_check``,
that it is keysvc's, and its pepper) with the standard library's ``sqlite3``, as the
copy is never served. The errors are the command's (``keysvc.ops.backup``)."""

import os
import sqlite3
from contextlib import closing
from pathlib import Path

from keysvc.db.sqlite.filewatch import refuse_split_index

# How long the copy waits for a lock, as the server's own busy_timeout does.
BUSY_SECONDS = 5.0


class BackupError(Exception):
    """No backup was made; the message says why, on one line."""

    exit_code = 1


class BackupRefused(BackupError):
    """Refused before copying: the destination exists, or the source cannot be backed up."""

    exit_code = 2


class BackupDamaged(BackupError):
    """The copy failed ``PRAGMA integrity_check``; nothing was kept."""


def copy_database(source: Path, dest: Path) -> None:
    # mode=rw: a missing source is an error here, never a new empty database.
    uri = source.resolve().as_uri() + "?mode=rw"
    # Its close would checkpoint and remove a log that a serving keysvc still uses.
    refuse_split_index(source)
    try:
        with (
            closing(sqlite3.connect(uri, uri=True, timeout=BUSY_SECONDS)) as src,
            closing(sqlite3.connect(dest)) as dst,
        ):
            # The default pages=-1 copies everything in one step: one snapshot.
            src.backup(dst)
            # The source is in WAL mode and so is the copy now; make it one
            # self-contained file before it is moved.
            dst.execute("pragma journal_mode = delete")
    except sqlite3.Error as exc:
        raise BackupError(f"could not copy {source}: {exc}") from None
    with open(dest, "rb+") as handle:
        os.fsync(handle.fileno())


def check_copy(source: Path, copy: Path, fingerprint: str) -> int:
    """Fail unless the copy is sound, is keysvc's, and matches the pepper; returns its key count."""
    try:
        with closing(sqlite3.connect(copy)) as conn:
            problems = [str(row[0]) for row in conn.execute("pragma integrity_check")]
            if problems != ["ok"]:
                shown = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
                raise BackupDamaged(
                    f"the copy of {source} failed PRAGMA integrity_check, so no backup was "
                    f"written; the database itself is likely damaged: {shown}"
                )
            (version,) = conn.execute("pragma user_version").fetchone()
            if not version:
                raise BackupRefused(f"{source} is not a keysvc database")
            (keys,) = conn.execute("select count(*) from api_keys").fetchone()
            recorded = conn.execute("select value from meta where name = 'pepper'").fetchone()
    except sqlite3.Error as exc:
        raise BackupError(f"could not check the copy of {source}: {exc}") from None
    if recorded is not None and recorded[0] != fingerprint:
        raise BackupRefused(
            f"the pepper does not match {source}: back up with the pepper file or "
            "KEYSVC_PEPPER the server uses"
        )
    return int(keys)
