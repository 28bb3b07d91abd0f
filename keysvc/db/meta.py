"""SQL about the database as a whole: its organizations, the pepper it was made
with, and the schema version it is at."""

from keysvc.config import ConfigError
from keysvc.db.contract import Connection
from keysvc.db.sqlite.migrations import schema_version
from keysvc.db.statements import fetch_all, fetch_one
from keysvc.models import Organization
from keysvc.timeutil import to_text

_PEPPER = "select value from meta where name = 'pepper'"
# The authorization generation: moved by every change to what some key may do.
GENERATION = "select value from meta where name = 'auth_generation'"


async def recorded_pepper(conn: Connection) -> str | None:
    """The fingerprint of the pepper this database was made with; None when new."""
    row = await fetch_one(conn, _PEPPER, ())
    return None if row is None else str(row["value"])


async def check_pepper(conn: Connection, fingerprint: str) -> None:
    """Inside a transaction: record the pepper's fingerprint on first start; refuse a
    different pepper later."""
    row = await fetch_one(conn, _PEPPER, ())
    if row is None:
        await conn.execute("insert into meta (name, value) values ('pepper', ?)", (fingerprint,))
    elif row["value"] != fingerprint:
        raise ConfigError(
            "the pepper does not match this database: restore the pepper file "
            "or KEYSVC_PEPPER that was used with it"
        )


async def schema_is_current(conn: Connection) -> bool:
    """True when the database answers and its schema is the one this code expects."""
    row = await fetch_one(conn, "pragma user_version", ())
    return row is not None and row[0] == schema_version()


async def has_organization(conn: Connection) -> bool:
    return await fetch_one(conn, "select 1 from organizations limit 1", ()) is not None


async def organization_ids(conn: Connection) -> list[str]:
    """Every organization's ID, oldest first."""
    rows = await fetch_all(conn, "select id from organizations order by created_at, id", ())
    return [str(row["id"]) for row in rows]


async def insert_organization(conn: Connection, org: Organization) -> None:
    await conn.execute(
        "insert into organizations (id, name, created_at) values (?, ?, ?)",
        (org.id, org.name, to_text(org.created_at)),
    )
