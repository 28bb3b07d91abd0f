"""Usage counts: authentications per key per minute by outcome, in memory until
written, and all SQL about them.

``Tally`` is one process's counts not yet written. ``Touches``
(``keysvc.db.batching``) takes them into the transaction that writes usedAt, or
one of their own every flush interval (``Store``), and each row is an upsert
that adds: several processes each count their own, and the sums add up. Rows
older than the retention go in ``prune``, which the store runs at most every
``PRUNE_EVERY_SECONDS``. A key's rows go with it (schema.sql's
``api_keys_usage_dropped``); a count for a key deleted before it was written is
dropped.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime

from keysvc.db.contract import Connection
from keysvc.db.dialect import Sql
from keysvc.db.statements import fetch_all
from keysvc.timeutil import to_text

# The outcomes counted, in the columns' order. Only requests whose credentials were
# right (a known key) are counted: unknown keys and wrong secrets are metrics only.
OUTCOMES = ("success", "disabled", "expired", "ip_denied", "forbidden", "rate_limited")
# Every outcome counted: key_usage's, then verifies refused for exhausted credits
# (issue 29), which have a table of their own, key_usage_credits, written beside it.
COUNTED = (*OUTCOMES, "credits_exhausted")
_KEY_USAGE_OUTCOMES = len(OUTCOMES)
PRUNE_EVERY_SECONDS = 300.0

# (key UUID, minute) -> counts in COUNTED's order (OUTCOMES' alone are read as such).
Counts = dict[tuple[str, datetime], list[int]]

# PostgreSQL types the selected parameters by their casts, and reads the row's own
# columns by the table's name.
ADD_COUNTS = Sql(
    """
    insert into key_usage (key_id, minute, success, disabled, expired, ip_denied, forbidden,
                           rate_limited)
    select ?, ?, ?, ?, ?, ?, ?, ? where exists (select 1 from api_keys where id = ?)
    on conflict (key_id, minute) do update set
        success = success + excluded.success,
        disabled = disabled + excluded.disabled,
        expired = expired + excluded.expired,
        ip_denied = ip_denied + excluded.ip_denied,
        forbidden = forbidden + excluded.forbidden,
        rate_limited = rate_limited + excluded.rate_limited
    """,
    """
    insert into key_usage (key_id, minute, success, disabled, expired, ip_denied, forbidden,
                           rate_limited)
    select ?::text, ?::text, ?::bigint, ?::bigint, ?::bigint, ?::bigint, ?::bigint, ?::bigint
    where exists (select 1 from api_keys where id = ?)
    on conflict (key_id, minute) do update set
        success = key_usage.success + excluded.success,
        disabled = key_usage.disabled + excluded.disabled,
        expired = key_usage.expired + excluded.expired,
        ip_denied = key_usage.ip_denied + excluded.ip_denied,
        forbidden = key_usage.forbidden + excluded.forbidden,
        rate_limited = key_usage.rate_limited + excluded.rate_limited
    """,
)
# Buckets are the leading characters of the minute's text: 16 for a minute
# (2026-01-02T03:04), 13 for an hour, 10 for a day.
SERIES = """
    select substr(minute, 1, ?) as bucket, sum(success) as success, sum(disabled) as disabled,
           sum(expired) as expired, sum(ip_denied) as ip_denied, sum(forbidden) as forbidden,
           sum(rate_limited) as rate_limited
    from key_usage where key_id = ? and minute >= ? and minute < ?
    group by bucket order by bucket
"""
PRUNE = "delete from key_usage where minute < ?"
PRUNE_EXHAUSTED = "delete from key_usage_credits where minute < ?"
ADD_EXHAUSTED = Sql(
    """
    insert into key_usage_credits (key_id, minute, exhausted)
    select ?, ?, ? where exists (select 1 from api_keys where id = ?)
    on conflict (key_id, minute) do update set exhausted = exhausted + excluded.exhausted
    """,
    """
    insert into key_usage_credits (key_id, minute, exhausted)
    select ?::text, ?::text, ?::bigint where exists (select 1 from api_keys where id = ?)
    on conflict (key_id, minute) do update
        set exhausted = key_usage_credits.exhausted + excluded.exhausted
    """,
)
SERIES_EXHAUSTED = """
    select substr(minute, 1, ?) as bucket, sum(exhausted) as credits_exhausted
    from key_usage_credits where key_id = ? and minute >= ? and minute < ?
    group by bucket order by bucket
"""


class Tally:
    """Counts not yet written, of this process only. The event loop's thread alone
    adds and takes."""

    def __init__(self) -> None:
        self._counts: Counts = {}

    def __bool__(self) -> bool:
        return bool(self._counts)

    def add(self, key_id: str, minute: datetime, outcome: int) -> None:
        """One authentication of ``key_id`` in ``minute``; ``outcome`` indexes COUNTED."""
        counts = self._counts.get((key_id, minute))
        if counts is None:
            counts = self._counts[(key_id, minute)] = [0] * len(COUNTED)
        counts[outcome] += 1

    def take(self) -> Counts:
        """Every count so far, which this tally then forgets."""
        taken, self._counts = self._counts, {}
        return taken

    def give_back(self, counts: Counts) -> None:
        """Counts taken whose write failed: kept for the next one."""
        for where, numbers in counts.items():
            kept = self._counts.setdefault(where, [0] * len(COUNTED))
            for index, number in enumerate(numbers):
                kept[index] += number


async def add_counts(conn: Connection, counts: Counts) -> None:
    """Add ``counts`` to the rows of their key and minute, inside the caller's transaction."""
    await conn.executemany(
        ADD_COUNTS,
        [
            (key_id, to_text(minute), *numbers[:_KEY_USAGE_OUTCOMES], key_id)
            for (key_id, minute), numbers in counts.items()
            if any(numbers[:_KEY_USAGE_OUTCOMES])
        ],
    )
    exhausted = [
        (key_id, to_text(minute), numbers[_KEY_USAGE_OUTCOMES], key_id)
        for (key_id, minute), numbers in counts.items()
        if len(numbers) > _KEY_USAGE_OUTCOMES and numbers[_KEY_USAGE_OUTCOMES]
    ]
    if exhausted:
        await conn.executemany(ADD_EXHAUSTED, exhausted)


async def prune(conn: Connection, before: datetime) -> None:
    """Delete the rows of minutes before ``before``."""
    await conn.execute(PRUNE, (to_text(before),))
    await conn.execute(PRUNE_EXHAUSTED, (to_text(before),))


async def series(
    conn: Connection, key_id: str, start: datetime, end: datetime, width: int
) -> Mapping[str, Sequence[int]]:
    """The key's counts from ``start`` up to ``end``, summed by the first ``width``
    characters of their minute: bucket text -> counts in OUTCOMES' order."""
    rows = await fetch_all(conn, SERIES, (width, key_id, to_text(start), to_text(end)))
    return {row["bucket"]: [int(row[name]) for name in OUTCOMES] for row in rows}


async def series_counted(
    conn: Connection, key_id: str, start: datetime, end: datetime, width: int
) -> Mapping[str, Sequence[int]]:
    """``series`` with the refusals for exhausted credits last: counts in COUNTED's order."""
    found = {
        bucket: [*counts, 0]
        for bucket, counts in (await series(conn, key_id, start, end, width)).items()
    }
    params = (width, key_id, to_text(start), to_text(end))
    for row in await fetch_all(conn, SERIES_EXHAUSTED, params):
        counts = found.setdefault(row["bucket"], [0] * len(COUNTED))
        counts[_KEY_USAGE_OUTCOMES] = int(row["credits_exhausted"])
    return found
