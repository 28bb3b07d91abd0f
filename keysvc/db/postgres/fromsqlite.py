"""``keysvc migrate``'s copy (``keysvc.ops.migrate``): a SQLite database copied whole into an
empty PostgreSQL one, so that its keys keep working on the second backend.

The source is read in one read transaction of a read-only connection (a snapshot);
the target keeps its pepper, since every stored hash and the activity chains are keyed
from it. The target is brought to the current schema and refused unless it holds
nothing else; every table of ``TABLES`` is copied with COPY in one transaction that
holds the write lock every instance takes, and the row counts of both sides are
compared before commit: any difference rolls everything back. Rows are only moved,
never printed or logged.
"""

import hmac
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from keysvc.config import ConfigError, pepper_path_of
from keysvc.credentials import PEPPER_BYTES, Hasher
from keysvc.db.postgres import schema as pgschema
from keysvc.db.sqlite.connections import require_existing
from keysvc.db.sqlite.migrations import schema_version

# Every table of the schema, in the order the copy fills them: parents before the
# tables whose foreign keys name them. meta comes last: the other tables' insert
# triggers move its auth_generation row, which must arrive as the source has it.
TABLES = (
    "organizations",
    "roles",
    "api_keys",
    "key_roles",
    "key_details",
    "deleted_credentials",
    "key_usage",
    "key_usage_credits",
    "identities",
    "activities",
    "activity_heads",
    "activity_anchors",
    "write_budgets",
    "webhooks",
    "webhook_deliveries",
    "webhook_attempts",
    "webhook_expiry_warnings",
    "leak_reports",
    "pending_leak_reports",
    "key_imports",
    "meta",
)
# What PostgreSQL's migration writes into a new database: the copy replaces these
# with the source's rows, and keeps PostgreSQL's own meta rows.
SEEDED = ("roles", "meta")
POSTGRES_META = ("schema_version",)
BATCH_ROWS = 2_000

_SOURCE_TABLES = "select name from sqlite_master where type = 'table' and name not like 'sqlite_%'"
_TARGET_COLUMNS = """
    select column_name from information_schema.columns
    where table_schema = current_schema() and table_name = $1
"""
_IDENTITIES = """
    select table_name, column_name from information_schema.columns
    where table_schema = current_schema() and is_identity = 'YES'
"""
_RESTART = "select setval(pg_get_serial_sequence($1, $2), $3, $4)"
_CUSTOM_ROLES = "select exists (select 1 from roles where type = 'custom')"
_TARGET_META = "select name, value from meta"
_CLEAR_META = "delete from meta where name <> all($1::text[])"
_CLEAR_ROLES = "delete from roles"
# The copied keys' insert trigger counted them again on top of the copied key_count.
_UNCOUNT = """
    update organizations set key_count = key_count - counted.n
    from (select organization_id, count(*) as n from api_keys group by organization_id)
        as counted
    where organizations.id = counted.organization_id
"""
_PEPPER = "select value from meta where name = 'pepper'"


class MigrateError(Exception):
    """Nothing was migrated; the message says why, on one line."""

    exit_code = 2


class CopyFailed(MigrateError):
    """The copy failed part way (PostgreSQL refused a row, say): it was rolled back."""

    exit_code = 1


class CountMismatch(CopyFailed):
    """The copy's counts differ from the source's: it was rolled back."""


@dataclass(frozen=True)
class Copied:
    table: str
    rows: int


def _quoted(table: str) -> str:
    """A table's name for a statement: only the declared names, never a value."""
    if table not in TABLES:
        raise ValueError(f"not a table keysvc migrates: {table!r}")
    return f'"{table}"'


def _select_all(table: str) -> str:
    return f"select * from {_quoted(table)}"  # noqa: S608 - a declared table name


def _count(table: str) -> str:
    return f"select count(*) from {_quoted(table)}"  # noqa: S608 - a declared table name


def source_pepper(db: Path, configured: bytes | None) -> bytes:
    """The pepper of the SQLite database at ``db``: its pepper file's, or KEYSVC_PEPPER's
    when it has none; refused when neither exists or the two differ."""
    path = pepper_path_of(db)
    try:
        from_file: bytes | None = path.read_bytes().strip()
    except FileNotFoundError:
        from_file = None
    if from_file is None:
        if configured is None:
            raise MigrateError(
                f"no pepper: {path} is missing and KEYSVC_PEPPER is not set; restore the"
                " pepper file beside the database, or set KEYSVC_PEPPER to its pepper"
            )
        return configured
    if len(from_file) < PEPPER_BYTES:
        raise MigrateError(f"pepper file {path} is damaged; restore it from backup")
    if configured is not None and not hmac.compare_digest(configured, from_file):
        raise MigrateError(
            f"KEYSVC_PEPPER differs from the pepper file {path}: unset it, or set it to"
            " that file's pepper, which the database was made with"
        )
    return from_file


@contextmanager
def snapshot(db: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``db`` inside one read transaction."""
    require_existing(db)
    uri = db.resolve().as_uri() + "?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, isolation_level=None)) as conn:
        conn.execute("begin")
        try:
            yield conn
        finally:
            conn.execute("rollback")


def check_source(conn: sqlite3.Connection, db: Path, pepper: bytes) -> None:
    """Refuse a source at another schema version, with a table the copy does not
    know (or without one it expects), or made with another pepper."""
    (version,) = conn.execute("pragma user_version").fetchone()
    if version < schema_version():
        raise MigrateError(
            f"database {db}: its schema (version {version}) is older than this keysvc's;"
            " start `keysvc serve` on it once with this keysvc to upgrade it, stop it,"
            " then migrate"
        )
    if version > schema_version():
        raise MigrateError(
            f"database {db}: its schema (version {version}) is newer than this keysvc's;"
            " migrate it with the keysvc that serves it"
        )
    tables = {row[0] for row in conn.execute(_SOURCE_TABLES)}
    unknown = sorted(tables - set(TABLES))
    if unknown:
        raise MigrateError(
            f"database {db} has a table `keysvc migrate` does not copy: {unknown[0]};"
            " nothing was written (use the keysvc that made the database)"
        )
    missing = sorted(set(TABLES) - tables)
    if missing:
        raise MigrateError(f"database {db} has no table {missing[0]}: it is not keysvc's")
    recorded = conn.execute(_PEPPER).fetchone()
    if recorded is None or recorded[0] != Hasher(pepper).fingerprint():
        raise MigrateError(
            f"the pepper does not match database {db}: give the pepper file or"
            " KEYSVC_PEPPER that was used with it"
        )


async def _check_target(conn: Any, fingerprint: str) -> None:
    """Inside the copy's transaction: refuse a target holding anything but what
    PostgreSQL's migration wrote (or the pepper record of a server started on it
    with this same pepper)."""
    for table in TABLES:
        if table in SEEDED:
            continue
        if await conn.fetchval(_count(table)):
            raise MigrateError(
                f"the target database is not empty (table {table} has rows): migrate"
                " into a new database; nothing was written"
            )
    if await conn.fetchval(_CUSTOM_ROLES):
        raise MigrateError(
            "the target database is not empty (table roles has custom roles): migrate"
            " into a new database; nothing was written"
        )
    for name, value in await conn.fetch(_TARGET_META):
        if name == "pepper" and value != fingerprint:
            raise MigrateError(
                "the target database was used with another pepper: migrate into a new"
                " database; nothing was written"
            )


async def _check_columns(conn: Any, table: str, columns: Sequence[str]) -> None:
    target = {row[0] for row in await conn.fetch(_TARGET_COLUMNS, table)}
    if target != set(columns):
        different = sorted(target ^ set(columns))
        raise MigrateError(
            f"table {table} has different columns on each side ({different[0]}):"
            " the target's schema is not this keysvc's; nothing was written"
        )


async def _copy_table(
    conn: Any, source: sqlite3.Connection, table: str, identities: dict[str, str]
) -> int:
    """Copy one table in batches; returns its rows. Restarts the table's identity
    column past the highest value copied, so that new rows do not collide."""
    cursor = source.execute(_select_all(table))
    columns = [column[0] for column in cursor.description]
    await _check_columns(conn, table, columns)
    identity = identities.get(table)
    at = columns.index(identity) if identity is not None else None
    rows, highest = 0, 0
    while batch := cursor.fetchmany(BATCH_ROWS):
        await conn.copy_records_to_table(table, records=batch, columns=columns)
        rows += len(batch)
        if at is not None:
            highest = max(highest, *(row[at] for row in batch))
    if identity is not None:
        await conn.fetchval(_RESTART, table, identity, max(highest, 1), highest > 0)
    return rows


async def _copy(conn: Any, source: sqlite3.Connection, fingerprint: str) -> list[Copied]:
    await conn.fetchval(pgschema.TAKE_LOCK, "write")  # as PgWriter's writes
    await _check_target(conn, fingerprint)
    await conn.execute(_CLEAR_META, list(POSTGRES_META))
    await conn.execute(_CLEAR_ROLES)
    identities = {row[0]: row[1] for row in await conn.fetch(_IDENTITIES)}
    copied = []
    for table in TABLES:
        copied.append(Copied(table, await _copy_table(conn, source, table, identities)))
        if table == "api_keys":
            await conn.execute(_UNCOUNT)
    for done in copied:
        found = await conn.fetchval(_count(done.table))
        if done.table == "meta":  # PostgreSQL's own rows are not the source's
            found -= len(POSTGRES_META)
        (in_source,) = source.execute(_count(done.table)).fetchone()
        if not found == in_source == done.rows:
            raise CountMismatch(
                f"table {done.table}: {in_source} rows in the source, {found} in the"
                " target after the copy; rolled back, nothing was written"
            )
    return copied


async def migrate(
    source_db: Path, url: str, configured_pepper: bytes | None, report: Callable[[str], None]
) -> list[Copied]:
    """Copy the SQLite database at ``source_db`` into the empty PostgreSQL database at
    ``url``; ``report`` is told one line per table copied."""
    pepper = source_pepper(source_db, configured_pepper)
    try:
        return await _migrate(source_db, url, pepper, report)
    except sqlite3.Error as exc:
        raise MigrateError(f"database {source_db}: cannot be read: {exc}") from None


async def _migrate(
    source_db: Path, url: str, pepper: bytes, report: Callable[[str], None]
) -> list[Copied]:
    fingerprint = Hasher(pepper).fingerprint()
    with snapshot(source_db) as source:
        check_source(source, source_db, pepper)
        try:
            conn = await asyncpg.connect(url)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise ConfigError(f"cannot use the PostgreSQL database: {exc}") from None
        try:
            await pgschema.migrate(conn)
            async with conn.transaction():
                copied = await _copy(conn, source, fingerprint)
        except asyncpg.PostgresError as exc:
            raise CopyFailed(f"the copy failed and was rolled back: {exc}") from None
        finally:
            await conn.close()
    for done in copied:
        report(f"{done.table}: {done.rows} rows copied, counts match")
    return copied
