"""SQLite connections, their pragmas, and schema migrations.

``schema.sql`` is the current schema and is applied whole to a new database.
A database made by an older keysvc is upgraded at start by the numbered steps
in ``MIGRATIONS``, all in one transaction; ``PRAGMA user_version`` records the
step a database is at. A database newer than this code is refused.

Only ``keysvc bootstrap`` makes a new database: the other commands open one
that exists (``create=False``), so a mistyped path is refused rather than
served empty. A database this process cannot write is refused at start with
the reason, not at the first write a client makes.
"""

import os
import sqlite3
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import aiosqlite

from keysvc.config import ConfigError

# MIGRATIONS[n] takes a database from version n + 1 to n + 2. Version 1 is the
# first release of schema.sql; append steps here and change schema.sql to match.
MIGRATIONS: Sequence[str] = (
    # 2: per-key request limits, and the generation that invalidates credential caches.
    """
    alter table api_keys add column rate_limit integer;
    alter table api_keys add column rate_window integer;
    insert or ignore into meta (name, value) values ('auth_generation', '0');
    """,
    # 3: each organization's key count, kept by triggers (see schema.sql).
    """
    alter table organizations add column key_count integer not null default 0;
    update organizations set key_count =
        (select count(*) from api_keys where api_keys.organization_id = organizations.id);
    create trigger if not exists api_keys_counted after insert on api_keys begin
        update organizations set key_count = key_count + 1 where id = new.organization_id;
    end;
    create trigger if not exists api_keys_uncounted after delete on api_keys begin
        update organizations set key_count = key_count - 1 where id = old.organization_id;
    end;
    """,
)

# How long a statement waits for another connection's lock before SQLITE_BUSY.
BUSY_TIMEOUT_MS = 5000
PRAGMAS = (
    "pragma journal_mode = wal",
    "pragma synchronous = full",
    "pragma foreign_keys = on",
    f"pragma busy_timeout = {BUSY_TIMEOUT_MS}",
)


def schema_sql() -> str:
    return resources.files("keysvc").joinpath("schema.sql").read_text()


def schema_version(migrations: Sequence[str] = MIGRATIONS) -> int:
    return 1 + len(migrations)


def require_existing(path: Path) -> None:
    """Refuse a database file that is not there (or empty): only bootstrap makes one."""
    if not path.is_file() or path.stat().st_size == 0:
        raise ConfigError(
            f"no database at {path}: make one with `keysvc bootstrap --db {path}`,"
            " or correct the path"
        )


def unusable(path: Path, exc: sqlite3.Error) -> ConfigError:
    """The one-line reason the database at ``path`` cannot be opened for writing."""
    folder = path.absolute().parent
    if path.exists() and not os.access(path, os.W_OK):
        reason = "the file is read-only to this user (see its mode, its owner and its mount)"
    elif not os.access(folder, os.W_OK | os.X_OK):
        reason = (
            f"its folder {folder} is read-only to this user, and SQLite writes"
            f" {path.name}-wal and {path.name}-shm beside it"
        )
    else:
        reason = str(exc)
    return ConfigError(f"cannot use the database {path}: {reason}")


async def connect(path: Path, *, create: bool = True) -> aiosqlite.Connection:
    """An autocommit connection (transactions are explicit) with the pragmas set.

    ``create=False`` opens only a file that exists: SQLite makes no new one.
    """
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(path, isolation_level=None)
    else:
        target = path.absolute().as_uri() + "?mode=rw"
        conn = await aiosqlite.connect(target, isolation_level=None, uri=True)
    try:
        conn.row_factory = sqlite3.Row
        for pragma in PRAGMAS:
            await conn.execute(pragma)
    except BaseException:
        await conn.close()
        raise
    return conn


def connect_now(path: Path, *, shared: bool = False) -> sqlite3.Connection:
    """``connect``'s synchronous twin, for create batches. ``shared``: usable from
    threads other than the one that opened it (one at a time: the caller's care)."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=not shared)
    try:
        conn.row_factory = sqlite3.Row
        for pragma in PRAGMAS:
            conn.execute(pragma)
    except BaseException:
        conn.close()
        raise
    return conn


async def migrate(
    conn: aiosqlite.Connection, migrations: Sequence[str] = MIGRATIONS, *, create: bool = True
) -> int:
    """Bring the database to the current version; returns the version it was at.

    ``create=False`` refuses a file keysvc has not made (version 0) instead of
    writing the schema into it.
    """
    target = schema_version(migrations)
    async with conn.execute("pragma user_version") as cursor:
        row = await cursor.fetchone()
    current = int(row[0]) if row else 0
    if current > target:
        raise ConfigError(
            f"database schema version {current} is newer than this keysvc supports ({target})"
        )
    if current == target:
        return current
    if current == 0 and not create:
        raise ConfigError(
            "the database has no keysvc schema: make one with `keysvc bootstrap`,"
            " or correct the path"
        )
    steps = [schema_sql()] if current == 0 else list(migrations[current - 1 :])
    # executescript runs the whole text; BEGIN inside it keeps every step and
    # the version bump in one transaction, rolled back together on failure.
    script = "begin immediate;\n" + "\n".join(steps) + f"\npragma user_version = {target};\ncommit;"
    try:
        await conn.executescript(script)
    except BaseException:
        if conn.in_transaction:
            await conn.rollback()
        raise
    return current
