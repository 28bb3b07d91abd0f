"""All SQL about webhooks and their delivery log, as plain text with ``?`` parameters:
the subscriptions an organization holds and the deliveries (with their attempts)
the API shows. The outbox that events are written to, and that the delivery task
reads, is ``keysvc.db.outbox``'s.
"""

import json
import sqlite3
from datetime import UTC, datetime

from keysvc.db.contract import Connection
from keysvc.db.dialect import Sql
from keysvc.db.statements import fetch_all, fetch_one
from keysvc.models import Attempt, Delivery, Webhook
from keysvc.timeutil import from_text, to_text

# A webhook's secret_version since Standard Webhooks: derived as BOUND_SECRET's
# (keysvc.credentials), shown as a Standard Webhooks secret (keysvc.domain.signing).
STANDARD_SECRET = 3
WEBHOOK = """
    select seq, id, organization_id, url, events, expiring_days, nonce, created_at,
           previous_until, failing_since, disabled_at
    from webhooks where id = ? and organization_id = ?
"""
WEBHOOKS_OF = """
    select seq, id, organization_id, url, events, expiring_days, nonce, created_at,
           previous_until, failing_since, disabled_at
    from webhooks where organization_id = ? order by seq
"""
COUNT_WEBHOOKS = "select count(*) from webhooks where organization_id = ?"
INSERT_WEBHOOK = """
    insert into webhooks (id, organization_id, url, events, expiring_days, nonce, created_at,
                          secret_version)
    values (?, ?, ?, ?, ?, ?, ?, ?)
"""
DELETE_WEBHOOK = "delete from webhooks where id = ? and organization_id = ?"
# A new secret (nonce, STANDARD_SECRET); the one it replaces signs too until ``until``.
NEW_NONCE = """
    update webhooks
    set previous_nonce = nonce, previous_secret_version = secret_version, previous_until = ?,
        nonce = ?, secret_version = ?
    where id = ? and organization_id = ?
"""
# Every attempt to the webhook failed since (the first such attempt's unix seconds),
# until one is delivered.
FAILING = "update webhooks set failing_since = coalesce(failing_since, ?) where id = ?"
NOT_FAILING = "update webhooks set failing_since = null where id = ? and failing_since is not null"
# Disabled at ``?`` if it has failed every attempt since ``?`` or before.
DISABLE_FAILING = """
    update webhooks set disabled_at = ?
    where id = ? and disabled_at is null and failing_since <= ?
"""
DISABLE = """
    update webhooks set disabled_at = ?
    where id = ? and organization_id = ? and disabled_at is null
"""
# Enabled again, its failure clock reset.
ENABLE = """
    update webhooks set disabled_at = null, failing_since = null
    where id = ? and organization_id = ? and disabled_at is not null
"""
DELIVERY_OF = """
    select seq, state, lease_until, give_up_at, event_type from webhook_deliveries
    where id = ? and webhook_id = ?
"""
REDELIVER = """
    update webhook_deliveries
    set state = 'pending', next_attempt_at = ?, give_up_at = ?, lease_until = null,
        lease_owner = null
    where seq = ?
"""
# Newest first, before the cursor's delivery (seq); one more than the page, to know
# whether another follows. One statement, so one snapshot: an attempt and its
# delivery's new state are committed together, and separate reads could show one
# without the other. The count's row comes first so that an empty page still has one.
_DELIVERY_PAGE = """
    with page as (
        select seq, id, event_id, event_type, created_at, state, next_attempt_at
        from webhook_deliveries where webhook_id = ? and seq < ? order by seq desc limit ?
    )
    select total.n as total, p.seq, p.id, p.event_id, p.event_type, p.created_at, p.state,
           p.next_attempt_at, a.at, a.status, a.error
    from (select count(*) as n from webhook_deliveries where webhook_id = ?) as total
    left join page as p on 1
    left join webhook_attempts as a on a.delivery_seq = p.seq
    order by p.seq desc, a.n
"""
# PostgreSQL joins on a boolean only.
DELIVERY_PAGE = Sql(_DELIVERY_PAGE, _DELIVERY_PAGE.replace("as p on 1", "as p on true"))


def webhook_from_row(row: sqlite3.Row) -> Webhook:
    return Webhook(
        seq=row["seq"],
        id=row["id"],
        organization_id=row["organization_id"],
        url=row["url"],
        events=tuple(json.loads(row["events"])),
        expiring_days=row["expiring_days"],
        nonce=row["nonce"],
        created_at=from_text(row["created_at"]),
        previous_until=from_unix(row["previous_until"]),
        failing_since=from_unix(row["failing_since"]),
        disabled_at=None if row["disabled_at"] is None else from_text(row["disabled_at"]),
    )


def from_unix(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.fromtimestamp(seconds, UTC)


async def get_webhook(conn: Connection, organization_id: str, webhook_id: str) -> Webhook | None:
    row = await fetch_one(conn, WEBHOOK, (webhook_id, organization_id))
    return None if row is None else webhook_from_row(row)


async def list_webhooks(conn: Connection, organization_id: str) -> list[Webhook]:
    return [webhook_from_row(row) for row in await fetch_all(conn, WEBHOOKS_OF, (organization_id,))]


async def count_webhooks(conn: Connection, organization_id: str) -> int:
    row = await fetch_one(conn, COUNT_WEBHOOKS, (organization_id,))
    return 0 if row is None else int(row[0])


async def insert_webhook(
    conn: Connection,
    webhook_id: str,
    organization_id: str,
    url: str,
    events: tuple[str, ...],
    expiring_days: int,
    nonce: bytes,
    created_at: datetime,
) -> Webhook:
    params = (webhook_id, organization_id, url, json.dumps(list(events)), expiring_days, nonce)
    await conn.execute(INSERT_WEBHOOK, (*params, to_text(created_at), STANDARD_SECRET))
    made = await get_webhook(conn, organization_id, webhook_id)
    assert made is not None  # inserted just now, in this transaction
    return made


async def rotate_secret(
    conn: Connection, organization_id: str, webhook_id: str, nonce: bytes, until: datetime
) -> Webhook | None:
    """Give the webhook a new secret (from ``nonce``); its current one signs beside it
    until ``until``. The webhook, or None if it is not this organization's."""
    params = (until.timestamp(), nonce, STANDARD_SECRET, webhook_id, organization_id)
    await conn.execute(NEW_NONCE, params)
    return await get_webhook(conn, organization_id, webhook_id)


async def attempted(conn: Connection, webhook_id: str, delivered: bool, at: float) -> None:
    """An attempt's outcome on the webhook's failure clock: a delivered one stops it, a
    failed one starts it unless it runs already."""
    if delivered:
        await conn.execute(NOT_FAILING, (webhook_id,))
    else:
        await conn.execute(FAILING, (at, webhook_id))


async def disable_failing(
    conn: Connection, webhook_id: str, at: datetime, failing_since: float
) -> bool:
    """Disable the webhook at ``at`` if it has failed every attempt since
    ``failing_since`` or before; whether it was disabled now."""
    cursor = await conn.execute(DISABLE_FAILING, (to_text(at), webhook_id, failing_since))
    return cursor.rowcount > 0


async def set_enabled(
    conn: Connection, organization_id: str, webhook_id: str, enabled: bool, at: datetime
) -> bool:
    """Enable (its failure clock reset) or disable the webhook; whether it changed."""
    if enabled:
        cursor = await conn.execute(ENABLE, (webhook_id, organization_id))
    else:
        cursor = await conn.execute(DISABLE, (to_text(at), webhook_id, organization_id))
    return cursor.rowcount > 0


async def redeliver(
    conn: Connection, webhook_id: str, delivery_id: str, now: float
) -> tuple[int, str] | None:
    """Make the webhook's delivery ``delivery_id`` due now: pending again, attempted once
    more even if it had failed (one attempt, then failed again, unless it still had
    retries left). One being attempted (leased, so pending, with its retries left) is
    left to that attempt. Its seq and event type; None if the webhook has no such
    delivery."""
    row = await fetch_one(conn, DELIVERY_OF, (delivery_id, webhook_id))
    if row is None:
        return None
    found = int(row["seq"]), str(row["event_type"])
    if row["state"] == "pending" and row["lease_until"] is not None and row["lease_until"] > now:
        return found
    give_up_at = max(float(row["give_up_at"]), now)
    await conn.execute(REDELIVER, (now, give_up_at, row["seq"]))
    return found


async def delete_webhook(conn: Connection, organization_id: str, webhook_id: str) -> bool:
    cursor = await conn.execute(DELETE_WEBHOOK, (webhook_id, organization_id))
    return cursor.rowcount > 0


async def delivery_page(
    conn: Connection, webhook_id: str, before: int | None, limit: int
) -> tuple[list[Delivery], bool, int]:
    """Deliveries of the webhook newest first, before the ``before``-th (none: from the
    newest), at most ``limit``: those, whether more follow, and how many it has."""
    upper = before if before is not None else 2**63 - 1
    rows = await fetch_all(conn, DELIVERY_PAGE, (webhook_id, upper, limit + 1, webhook_id))
    found: dict[int, tuple[sqlite3.Row, list[Attempt]]] = {}
    for row in rows:
        if row["seq"] is None:
            continue  # the count's row of an empty page
        _, attempts = found.setdefault(row["seq"], (row, []))
        if row["at"] is not None:
            attempts.append(Attempt(from_text(row["at"]), row["status"], row["error"]))
    deliveries = [
        Delivery(
            seq=row["seq"],
            id=row["id"],
            event_id=row["event_id"],
            event_type=row["event_type"],
            created_at=from_text(row["created_at"]),
            state=row["state"],
            attempts=tuple(attempts),
            next_attempt_at=from_unix(row["next_attempt_at"]),
        )
        for row, attempts in found.values()
    ]
    return deliveries[:limit], len(deliveries) > limit, int(rows[0]["total"])
