"""SQLite connections, their pragmas, and schema migrations.

``schema.sql`` is the current schema and is applied whole to a new database.
A database made by an older keysvc is upgraded at start by the numbered steps
in ``MIGRATIONS``, all in one transaction; ``PRAGMA user_version`` records the
step a database is at. A database newer than this code is refused.

A database keysvc creates is made 0600 before SQLite opens it, whatever the
umask; SQLite gives the ``-wal`` and ``-shm`` files it makes beside it the
database's own mode, so they are 0600 too. A file that already exists keeps
the mode its owner gave it.

Only ``keysvc bootstrap`` makes a new database: the other commands open one
that exists (``create=False``), so a mistyped path is refused rather than
served empty. A database this process cannot write is refused at start with
the reason, not at the first write a client makes.
"""

import logging
import os
import sqlite3
import stat
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import aiosqlite

from keysvc.config import ConfigError

logger = logging.getLogger("keysvc")

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
    # 4: changes to keys, their roles and roles, by hand included, move auth_generation.
    """
    create trigger if not exists api_keys_access_changed
    after update of id, organization_id, name, state, key_id_hash, secret_hash, key_suffix,
        ip_access_list, created_at, expire_at, rate_limit, rate_window on api_keys
    begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists api_keys_access_removed after delete on api_keys begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists key_roles_granted after insert on key_roles begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists key_roles_revoked after delete on key_roles begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists roles_changed after update on roles begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    create trigger if not exists roles_removed after delete on roles begin
        update meta set value = cast(value as integer) + 1 where name = 'auth_generation';
    end;
    """,
    # 5: each key's place in its organization, for list cursors (see schema.sql).
    """
    alter table organizations add column last_key_seq integer not null default 0;
    alter table api_keys add column org_seq integer not null default 0;
    update api_keys set org_seq = ranked.n
    from (select seq, row_number() over (partition by organization_id order by seq) as n
          from api_keys) as ranked
    where ranked.seq = api_keys.seq;
    update organizations set last_key_seq = coalesce(
        (select max(org_seq) from api_keys where api_keys.organization_id = organizations.id), 0);
    drop index if exists api_keys_org_seq;
    create unique index if not exists api_keys_org_position on api_keys (organization_id, org_seq);
    drop trigger if exists api_keys_counted;
    create trigger api_keys_counted after insert on api_keys begin
        update organizations set key_count = key_count + 1,
                                 last_key_seq = max(last_key_seq, new.org_seq)
        where id = new.organization_id;
    end;
    """,
    # 6: a key deleted by hand with foreign keys off (the sqlite3 shell's default) takes
    # its role rows with it, as the cascade would; rows such a delete left behind go.
    """
    delete from key_roles where key_id not in (select id from api_keys);
    create trigger if not exists api_keys_roles_dropped after delete on api_keys begin
        delete from key_roles where key_id = old.id;
    end;
    """,
)

# Owner read and write only, as the pepper file.
DB_MODE = 0o600
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


def create_private(path: Path) -> None:
    """Create ``path`` empty and 0600 if it does not exist (SQLite would make it
    0666 less the umask); an empty file is a new database to SQLite."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, DB_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, DB_MODE)  # a umask such as 0o277 would have taken the write bit
    finally:
        os.close(fd)


_warned: set[Path] = set()


def warn_if_exposed(path: Path) -> None:
    """Log once per process when the database file is open to its group or others, as
    one made by an older keysvc is (0644): its mode is the operator's to keep, but
    the keyed hashes in it are worth keeping private. Asked once the database has
    been found usable, so that a refusal at start stays one line."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return
    if mode & 0o077 and path not in _warned:
        _warned.add(path)
        logger.warning(
            "database file %s has mode %s, readable beyond its owner: chmod 600 it",
            path,
            oct(mode),
        )


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
        create_private(path)
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
    create_private(path)
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
