"""Online backups: ``keysvc backup``, a consistent copy of a serving database.

SQLite's backup API copies the whole database in one step, inside one read
transaction, so in WAL mode the copy is a snapshot: every write committed
before the step began is in it and none that committed later is, while the
server goes on writing. The copy is made in a temporary file in the
destination's directory, checked with ``PRAGMA integrity_check``, and only then
linked into place, so a backup file is either complete or absent, and an
existing file is never replaced. The pepper file goes alongside, because
without it no stored key verifies.

The copy and its checks are the database layer's (``keysvc.db.sqlite.backup``); a
PostgreSQL database is refused (``keysvc.db.backends.database_file``).
"""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from keysvc.config import Settings, pepper_path_of
from keysvc.credentials import PEPPER_BYTES, Hasher
from keysvc.db.backends import database_file
from keysvc.db.sqlite.backup import BackupDamaged as BackupDamaged
from keysvc.db.sqlite.backup import BackupError as BackupError
from keysvc.db.sqlite.backup import BackupRefused, check_copy, copy_database

PEPPER_MODE = 0o600


@dataclass(frozen=True)
class Backup:
    """A finished backup; ``pepper_path`` is None when the pepper is not in a file."""

    path: Path
    size: int  # bytes
    keys: int
    pepper_path: Path | None

    def as_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "bytes": self.size,
            "keys": self.keys,
            "pepperPath": None if self.pepper_path is None else str(self.pepper_path),
        }


# What backup says on PostgreSQL.
SQLITE_ONLY = "backup copies a SQLite file; back a PostgreSQL database up with pg_dump"


def backup(settings: Settings, out: Path) -> Backup:
    """``make_backup`` of the database ``settings`` names, which must be a file."""
    db_path = database_file(settings, SQLITE_ONLY)
    return make_backup(db_path, out, settings.pepper, settings.pepper_path)


def make_backup(db_path: Path, out: Path, pepper: bytes | None, pepper_path: Path) -> Backup:
    """Copy the database at ``db_path`` to the new file ``out``.

    ``pepper`` is the configured pepper (KEYSVC_PEPPER) or None, in which case
    the pepper file ``pepper_path`` is copied to ``out`` + ".pepper" (mode 0600).
    Either way the pepper must be the one the database was made with.
    """
    out = Path(os.path.abspath(out))
    out_pepper = None if pepper is not None else pepper_path_of(out)
    for target in (out, out_pepper):
        if target is not None and os.path.lexists(target):
            raise BackupRefused(f"{target} already exists; a backup never overwrites a file")
    if not out.parent.is_dir():
        raise BackupRefused(f"directory {out.parent} does not exist")
    if not db_path.is_file():
        raise BackupRefused(f"no database at {db_path}")
    pepper_file = None if pepper is not None else _read_pepper(pepper_path)
    if pepper_file is not None:
        pepper = pepper_file.strip()  # as keysvc.credentials.load_pepper reads it
    assert pepper is not None

    with _temporary(out) as db_copy:
        copy_database(db_path, db_copy)
        keys = check_copy(db_path, db_copy, Hasher(pepper).fingerprint())
        if out_pepper is not None and pepper_file is not None:
            with _temporary(out) as pepper_copy:
                _write_private(pepper_copy, pepper_file)
                _publish(pepper_copy, out_pepper)
        try:
            _publish(db_copy, out)
        except BaseException:
            if out_pepper is not None:
                out_pepper.unlink()
            raise
    _sync_directory(out.parent)
    return Backup(path=out, size=out.stat().st_size, keys=keys, pepper_path=out_pepper)


def _read_pepper(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BackupRefused(
            f"pepper file {path} not found: without it no key in a backup verifies "
            "(set KEYSVC_PEPPER if the pepper is kept there)"
        ) from None
    if len(raw.strip()) < PEPPER_BYTES:
        raise BackupRefused(f"pepper file {path} is damaged; restore it before backing up")
    return raw


@contextmanager
def _temporary(out: Path) -> Iterator[Path]:
    """A new empty 0600 file beside ``out``, removed afterwards with SQLite's side files."""
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    path = Path(name)
    try:
        yield path
    finally:
        for leftover in (path, *(Path(name + side) for side in ("-journal", "-wal", "-shm"))):
            with suppress(FileNotFoundError):
                leftover.unlink()


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), PEPPER_MODE)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _publish(temporary: Path, final: Path) -> None:
    """Give the finished ``temporary`` its ``final`` name, atomically and never over a file.

    A hard link is an atomic rename that fails when the name is taken (rename
    would silently replace it); the temporary name is removed afterwards.
    """
    try:
        os.link(temporary, final)
    except FileExistsError:
        raise BackupRefused(f"{final} already exists; a backup never overwrites a file") from None


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
