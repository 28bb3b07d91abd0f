"""Revoke-by-secret reports received and not yet acted on (``pending_leak_reports``):
written before the report is answered, taken oldest first by each instance's
background task (``keysvc.domain.leaks.PendingReports``), which acts on one and deletes
it in the same write transaction. A row holds the secret's keyed hash (the one
``keysvc.db.keys.BY_SECRET`` looks keys up by), never the secret, never a plain digest;
who reported it, the action then configured, and when.
"""

from dataclasses import dataclass
from datetime import datetime

from keysvc.db.contract import Connection
from keysvc.db.dialect import Sql
from keysvc.db.statements import fetch_all, fetch_one
from keysvc.models import Actor
from keysvc.timeutil import from_text, to_text


@dataclass(frozen=True)
class PendingReport:
    """One report waiting for its work: ``seq`` orders them, oldest first."""

    seq: int
    secret_hash: bytes
    actor: Actor
    action: str
    reported_at: datetime


# Counted up to the bound only: the count costs the same below it, hit or miss.
_COUNT = "select count(*) from (select 1 from pending_leak_reports limit ?) waiting"
_INSERT = """
    insert into pending_leak_reports
        (secret_hash, actor_type, actor_ip, user_agent, actor_details, action, reported_at)
    values (?, ?, ?, ?, ?, ?, ?)
"""
# Taken inside a write transaction, which on PostgreSQL already holds the instances'
# write lock; skip locked keeps two instances off one row should that lock ever go.
_OLDEST_SQLITE = """
    select seq, secret_hash, actor_type, actor_ip, user_agent, actor_details, action, reported_at
    from pending_leak_reports where seq > ? order by seq limit 1
"""
_OLDEST = Sql(_OLDEST_SQLITE, _OLDEST_SQLITE + " for update skip locked")
_DELETE = "delete from pending_leak_reports where seq = ?"
_ANY = "select exists (select 1 from pending_leak_reports) as waiting"


async def count_pending(conn: Connection, most: int) -> int:
    """How many reports wait, counted up to ``most``."""
    row = await fetch_one(conn, _COUNT, (most,))
    return int(row[0])


async def any_pending(conn: Connection) -> bool:
    """Whether any report waits: a read, for a reader, so that looking takes no write lock."""
    row = await fetch_one(conn, _ANY, ())
    return bool(row[0])


async def add_pending(
    conn: Connection, secret_hash: bytes, actor: Actor, action: str, now: datetime
) -> None:
    await conn.execute(
        _INSERT,
        (
            secret_hash,
            actor.type,
            actor.ip,
            actor.user_agent,
            actor.details,
            action,
            to_text(now, fraction=True),
        ),
    )


async def oldest_pending(conn: Connection, after: int = 0) -> PendingReport | None:
    """The oldest report past ``after`` (a ``seq``), or None."""
    rows = await fetch_all(conn, _OLDEST, (after,))
    if not rows:
        return None
    row = rows[0]
    actor = Actor(
        row["actor_type"],
        ip=row["actor_ip"],
        user_agent=row["user_agent"],
        details=row["actor_details"],
    )
    return PendingReport(
        int(row["seq"]),
        bytes(row["secret_hash"]),
        actor,
        row["action"],
        from_text(row["reported_at"]),
    )


async def remove_pending(conn: Connection, seq: int) -> None:
    await conn.execute(_DELETE, (seq,))
