"""Online backups: ``keysvc backup``, a consistent copy of a serving database.

SQLite's backup API copies the whole database in one step, inside one read
transaction, so in WAL mode the copy is a snapshot: every write committed
before the step began is in it and none that committed later is, while the
server goes on writing. The copy is made in a temporary file in the
destination's directory, checked with ``PRAGMA integrity_check``, and only then
linked into place, so a backup file is either complete or absent, and an
existing file is never replaced. The pepper file goes alongside, because
without it no stored key verifies.

The few queries here are read-only checks of the finished copy, made with the
standard library's ``sqlite3`` because the copy is never served.
"""

import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from keysvc.config import pepper_path_of
from keysvc.credentials import PEPPER_BYTES, Hasher

# How long the copy waits for a lock, as the server's own busy_timeout does.
BUSY_SECONDS = 5.0
PEPPER_MODE = 0o600


class BackupError(Exception):
    """No backup was made; the message says why, on one line."""

    exit_code = 1


class BackupRefused(BackupError):
    """Refused before copying: the destination exists, or the source cannot be backed up."""

    exit_code = 2


class BackupDamaged(BackupError):
    """The copy failed ``PRAGMA integrity_check``; nothing was kept."""


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
        _copy_database(db_path, db_copy)
        keys = _check_copy(db_path, db_copy, Hasher(pepper).fingerprint())
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


def _copy_database(source: Path, dest: Path) -> None:
    # mode=rw: a missing source is an error here, never a new empty database.
    uri = source.resolve().as_uri() + "?mode=rw"
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


def _check_copy(source: Path, copy: Path, fingerprint: str) -> int:
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
