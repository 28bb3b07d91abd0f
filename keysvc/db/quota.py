"""What one organization may make the shared database hold: a write budget (bytes of
activity records and webhook delivery bodies an hour) and a queue limit (deliveries
waiting per webhook). Both are checked inside the write's transaction, before its
rows go in, so that a refused write stores nothing, its budget charge included.

The budget counts in fixed hours (``write_budgets``, one row per organization): a
flood that starts late in one hour may write up to twice the budget before it is
refused. Refusals are 429 with a Retry-After and name the setting to change.
"""

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keysvc.db.contract import Connection
from keysvc.db.dialect import with_json_list
from keysvc.db.statements import fetch_all
from keysvc.errors import TooManyRequests

HOUR = 3600
MIB = 1024 * 1024

_CHARGE = """
    insert into write_budgets (organization_id, window_start, bytes) values (?, ?, ?)
    on conflict (organization_id) do update
    set bytes = case when write_budgets.window_start = excluded.window_start
                     then write_budgets.bytes + excluded.bytes else excluded.bytes end,
        window_start = excluded.window_start
    returning bytes
"""
_WAITING = with_json_list(
    """
    select webhook_id, count(*) from webhook_deliveries
    where state = 'pending' and webhook_id in {json_list}
    group by webhook_id
    """
)
# How long a full queue is told to wait: about when a first retry of what waits ends.
QUEUE_RETRY_AFTER = 60


@dataclass(frozen=True)
class Quota:
    """An organization's write budget in bytes an hour, and the deliveries that may wait
    per webhook; 0 turns either off."""

    bytes_per_hour: int = 0
    queue_limit: int = 0


UNLIMITED = Quota()


def quota_of(budget_mib: int, queue_limit: int) -> Quota:
    return Quota(budget_mib * MIB, queue_limit)


def _over_budget(quota: Quota, organization_id: str, used: int, start: int, now: float) -> None:
    if used > quota.bytes_per_hour:
        raise TooManyRequests(
            f"organization {organization_id} has used its write budget of"
            f" {quota.bytes_per_hour // MIB} MiB of activities and webhook deliveries this"
            " hour (KEYSVC_ORG_WRITE_BUDGET_MIB); try again when the hour ends",
            retry_after=max(1, start + HOUR - int(now)),
        )


def _queue_full(quota: Quota, waiting: Sequence[Any]) -> None:
    for webhook_id, count in waiting:
        if int(count) >= quota.queue_limit:
            raise TooManyRequests(
                f"webhook {webhook_id} has {count} deliveries waiting, its queue limit"
                " (KEYSVC_WEBHOOK_QUEUE_LIMIT); fix its receiver or delete it, or try"
                " again later",
                retry_after=QUEUE_RETRY_AFTER,
            )


async def charge(
    conn: Connection, quota: Quota, organization_id: str, size: int, now: float
) -> None:
    """Inside the write's transaction: count ``size`` bytes against the organization's
    hour; TooManyRequests when that passes its budget."""
    if quota.bytes_per_hour and size:
        start = int(now) // HOUR * HOUR
        rows = await fetch_all(conn, _CHARGE, (organization_id, start, size))
        _over_budget(quota, organization_id, int(rows[0][0]), start, now)


def charge_now(
    conn: sqlite3.Connection, quota: Quota, organization_id: str, size: int, now: float
) -> None:
    """``charge`` on a create batch's synchronous connection."""
    if quota.bytes_per_hour and size:
        start = int(now) // HOUR * HOUR
        rows = conn.execute(_CHARGE, (organization_id, start, size)).fetchall()
        _over_budget(quota, organization_id, int(rows[0][0]), start, now)


async def admit(conn: Connection, quota: Quota, webhook_ids: Sequence[str]) -> None:
    """Inside the write's transaction, before its deliveries go in: TooManyRequests when
    one of ``webhook_ids`` has its queue limit of deliveries waiting already."""
    if quota.queue_limit and webhook_ids:
        _queue_full(quota, await fetch_all(conn, _WAITING, (json.dumps(list(webhook_ids)),)))


def admit_now(conn: sqlite3.Connection, quota: Quota, webhook_ids: Sequence[str]) -> None:
    """``admit`` on a create batch's synchronous connection."""
    if quota.queue_limit and webhook_ids:
        _queue_full(quota, conn.execute(_WAITING, (json.dumps(list(webhook_ids)),)).fetchall())
