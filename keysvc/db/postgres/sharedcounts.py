"""The SQL of the counts the instances on one PostgreSQL database share
(``keysvc.domain.sharedlimits``): each process's counts added in one statement that reads
back the totals, and ended windows pruned. PostgreSQL only: schema_postgres.sql's
``shared_limits`` table has no SQLite counterpart."""

from collections.abc import Sequence
from typing import Any

# One statement for every name a process counted since its last: a name's row is made
# or added to, and its total, every instance's counts in it, comes back.
_ADD = """
insert into shared_limits (name, starts_at, expires_at, count)
select * from unnest(?::text[], ?::bigint[], ?::double precision[], ?::bigint[])
on conflict (name, starts_at) do update set count = shared_limits.count + excluded.count
returning name, starts_at, count
"""
_PRUNE = "delete from shared_limits where expires_at < ?"
# The failed-login counts of one window at or past a limit: the networks to refuse.
_BLOCKED = """
select name, count from shared_limits
where name like 'n:%' and starts_at = ? and count >= ?
order by count desc limit ?
"""

# (name, window start, window end, count): one row of counts to add.
Added = tuple[str, int, float, int]


async def add(conn: Any, rows: Sequence[Added]) -> dict[tuple[str, int], int]:
    """Add ``rows`` (each (name, window) at most once) to the shared counts; the total
    of each, by (name, window start)."""
    names, starts, ends, counts = (list(column) for column in zip(*rows, strict=True))
    totals = await conn.execute_fetchall(_ADD, (names, starts, ends, counts))
    return {(row["name"], row["starts_at"]): row["count"] for row in totals}


async def prune(conn: Any, now: float) -> None:
    """Drop the counts of windows that ended before ``now``."""
    await conn.execute(_PRUNE, (now,))


async def blocked(conn: Any, start: int, limit: int, most: int) -> dict[str, int]:
    """The networks (by name) with ``limit`` failed logins or more in the window that
    began at ``start``, at most ``most`` of them, and their counts."""
    rows = await conn.execute_fetchall(_BLOCKED, (start, limit, most))
    return {row["name"]: row["count"] for row in rows}
