"""What one organization may make the shared database hold: a write budget (bytes of
activity records and webhook delivery bodies an hour) and a queue limit (deliveries
waiting per webhook). Both are checked inside the write's transaction, before its
rows go in, so that a refused write stores nothing, its budget charge included.

The budget counts in fixed hours (``write_budgets``, one row per organization): a
flood that starts late in one hour may write up to twice the budget before it is
refused. Refusals are 429 with a Retry-After and name the setting to change.

A revocation (a key disabled, deleted or reported leaked: ``revoking=True``) is never
refused, so that nothing a leaked key writes can delay its own end: its bytes are
counted all the same, and its events go to each webhook whose queue has room within
a reserve past the limit (``reserve_of``: a tenth of it, at least one), kept for
revocations alone since ordinary writes stop at the limit. A webhook whose reserve is
full too (its receiver has not taken a thousand deliveries or more) does not get the
event: the write goes on, and the drop is logged and counted (``DROPPED``), since a
revocation that waits on a dead receiver is worse than a lost notice of it.
"""

import json
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keysvc.db.contract import Connection
from keysvc.db.dialect import with_json_list
from keysvc.db.statements import fetch_all
from keysvc.errors import TooManyRequests

logger = logging.getLogger("keysvc")

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


def reserve_of(queue_limit: int) -> int:
    """The deliveries a revocation's events may add to a webhook past its queue limit."""
    return max(1, queue_limit // 10)


class Dropped:
    """Revocation events not queued for a webhook whose reserve was full, this process."""

    def __init__(self) -> None:
        self.count = 0


DROPPED = Dropped()


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
    conn: Connection,
    quota: Quota,
    organization_id: str,
    size: int,
    now: float,
    revoking: bool = False,
) -> None:
    """Inside the write's transaction: count ``size`` bytes against the organization's
    hour; TooManyRequests when that passes its budget, unless ``revoking``."""
    if quota.bytes_per_hour and size:
        start = int(now) // HOUR * HOUR
        rows = await fetch_all(conn, _CHARGE, (organization_id, start, size))
        if not revoking:
            _over_budget(quota, organization_id, int(rows[0][0]), start, now)


def charge_now(
    conn: sqlite3.Connection, quota: Quota, organization_id: str, size: int, now: float
) -> None:
    """``charge`` on a create batch's synchronous connection (never a revocation)."""
    if quota.bytes_per_hour and size:
        start = int(now) // HOUR * HOUR
        rows = conn.execute(_CHARGE, (organization_id, start, size)).fetchall()
        _over_budget(quota, organization_id, int(rows[0][0]), start, now)


async def admit(
    conn: Connection, quota: Quota, webhook_ids: Sequence[str], revoking: bool = False
) -> list[str]:
    """Inside the write's transaction, before its deliveries go in: the webhooks of
    ``webhook_ids`` that take the event. TooManyRequests when one has its queue limit of
    deliveries waiting already; for a revocation, those past the limit and its reserve
    are left out instead (logged and counted)."""
    if not quota.queue_limit or not webhook_ids:
        return list(webhook_ids)
    waiting = await fetch_all(conn, _WAITING, (json.dumps(list(webhook_ids)),))
    if not revoking:
        _queue_full(quota, waiting)
        return list(webhook_ids)
    bound = quota.queue_limit + reserve_of(quota.queue_limit)
    full = {str(webhook_id) for webhook_id, count in waiting if int(count) >= bound}
    for webhook_id in full:
        DROPPED.count += 1
        logger.warning(
            "webhook %s: a revocation's event not queued, %d waiting already (past"
            " KEYSVC_WEBHOOK_QUEUE_LIMIT and its reserve); the revocation itself is done",
            webhook_id, bound,
        )  # fmt: skip
    return [webhook_id for webhook_id in webhook_ids if webhook_id not in full]


def admit_now(conn: sqlite3.Connection, quota: Quota, webhook_ids: Sequence[str]) -> None:
    """``admit`` on a create batch's synchronous connection (never a revocation)."""
    if quota.queue_limit and webhook_ids:
        _queue_full(quota, conn.execute(_WAITING, (json.dumps(list(webhook_ids)),)).fetchall())
