"""The webhook outbox: events written in the transaction of the write that made them,
one row per event and subscribed webhook, and the short statements the delivery task
(``keysvc.ops.delivery``) claims, records and releases them with.

``enqueue`` is the one way an event enters the outbox; ``enqueue_now`` is its
synchronous twin for the create batches' own connection (``keysvc.db.sqlite.createbatch``).
Both build the same rows (``_rows``). A disabled webhook is sent no event, and its
pending deliveries wait, unattempted, until it is enabled again. Nothing here waits
on the network: a claim leases deliveries in one short transaction, the attempt
happens outside any, and its outcome is recorded in another.

Each row carries a MAC (``Seal``), made with a key derived from the pepper, over
everything its attempt sends and where: the delivery's and its webhook's IDs, the
organization, the target URL, the event's ID and type, and the body. The delivery
task sends a row only if its MAC verifies against the row and its webhook as they are
then, so a row written or changed by someone who can write the database but does not
hold the pepper is never signed. Rows queued before the MAC existed have none, and
are not sent either.
"""

import json
import sqlite3
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from keysvc.db import quota as quota_sql
from keysvc.db.contract import Connection
from keysvc.db.dialect import Sql, with_json_list
from keysvc.db.quota import Quota
from keysvc.db.seal import Seal
from keysvc.db.statements import fetch_all, fetch_one
from keysvc.timeutil import to_text

# How long a delivery is retried after its event: past it, the delivery has failed.
RETRY_FOR_SECONDS = 24 * 3600
# How long a delivered or failed delivery stays in the log after its event.
KEEP_SECONDS = 30 * 24 * 3600
PRUNED_PER_TRANSACTION = 1000

# The webhooks subscribed to an event type: their events (a JSON array) hold it.
SUBSCRIBERS = Sql(
    """
    select id, url from webhooks
    where organization_id = ? and disabled_at is null
      and exists (select 1 from json_each(webhooks.events) where value = ?)
    order by seq
    """,
    """
    select id, url from webhooks
    where organization_id = ? and disabled_at is null
      and webhooks.events::jsonb @> jsonb_build_array(?::text)
    order by seq
    """,
)
SUBSCRIBERS_OF = with_json_list(
    """
    select id, organization_id, url from webhooks
    where organization_id in {json_list} and disabled_at is null
      and exists (select 1 from json_each(webhooks.events) where value = ?)
    order by seq
    """,
    """
    select id, organization_id, url from webhooks
    where organization_id in {json_list} and disabled_at is null
      and webhooks.events::jsonb @> jsonb_build_array(?::text)
    order by seq
    """,
)
INSERT_DELIVERY = """
    insert into webhook_deliveries (id, webhook_id, event_id, event_type, body, created_at,
                                    give_up_at, state, next_attempt_at, mac)
    values (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?)
"""
# The next attempts to make, fairly: a webhook has one attempt under way at most (the
# head of its due deliveries, and none while one of its deliveries is leased), an
# organization at most ``per_org`` (the leases held in every process count), and the
# heads are taken round the organizations, the one with fewest attempts under way first
# (``share``: its attempts under way once this one starts), then the oldest due. So one
# tenant's slow receivers hold one slot each, its share in all, and every other tenant's
# next delivery comes first once a slot is free. Each webhook's head is one seek in
# ``webhook_deliveries_next``, however long its queue, and the leased rows, few (at
# most the processes' concurrency), are found in ``webhook_deliveries_leased``.
DUE = """
    with busy as (
        select d.webhook_id, w.organization_id
        from webhook_deliveries d join webhooks w on w.id = d.webhook_id
        where d.state = 'pending' and d.lease_until > ?
    ),
    heads as (
        select w.organization_id,
               (select d.seq from webhook_deliveries d
                where d.webhook_id = w.id and d.state = 'pending' and d.next_attempt_at <= ?
                  and (d.lease_until is null or d.lease_until <= ?)
                order by d.next_attempt_at, d.seq limit 1) as seq
        from webhooks w
        where w.id not in (select webhook_id from busy) and w.disabled_at is null
    ),
    turns as (
        select h.seq, d.next_attempt_at,
               row_number() over (partition by h.organization_id
                                  order by d.next_attempt_at, h.seq)
               + (select count(*) from busy b where b.organization_id = h.organization_id)
               as share
        from heads h join webhook_deliveries d on d.seq = h.seq
    )
    select d.seq, d.event_id, d.event_type, d.body, d.attempts, d.give_up_at, w.url, w.nonce,
           d.id, d.webhook_id, d.mac, w.organization_id, w.secret_version, w.previous_nonce,
           w.previous_secret_version, w.previous_until
    from turns t
    join webhook_deliveries d on d.seq = t.seq
    join webhooks w on w.id = d.webhook_id
    where t.share <= ?
    order by t.share, t.next_attempt_at, t.seq
    limit ?
"""
LEASE = with_json_list(
    "update webhook_deliveries set lease_until = ?, lease_owner = ? where seq in {json_list}",
    "update webhook_deliveries set lease_until = ?, lease_owner = ? where seq::text in {json_list}",
)
RECORD_ATTEMPT = Sql(
    """
    insert into webhook_attempts (delivery_seq, n, at, status, error)
    select seq, attempts + 1, ?, ?, ? from webhook_deliveries where seq = ? and lease_owner = ?
    """,
    """
    insert into webhook_attempts (delivery_seq, n, at, status, error)
    select seq, attempts + 1, ?::text, ?::bigint, ?::text from webhook_deliveries
    where seq = ? and lease_owner = ?
    """,
)
FINISH_ATTEMPT = """
    update webhook_deliveries
    set attempts = attempts + 1, state = ?, next_attempt_at = ?, lease_until = null,
        lease_owner = null
    where seq = ? and lease_owner = ?
"""
RELEASE = """
    update webhook_deliveries set lease_until = null, lease_owner = null where lease_owner = ?
"""
# Keys that an enabled webhook subscribed to key.expiring should now warn of, and has
# not for this expiry date: enabled, expiring after ``now`` and within its expiringDays.
EXPIRING = Sql(
    """
    select w.id as webhook_id, k.id as key_id, k.organization_id, k.expire_at
    from webhooks w join api_keys k on k.organization_id = w.organization_id
    where exists (select 1 from json_each(w.events) where value = 'key.expiring')
      and w.disabled_at is null and k.state = 'enabled' and k.expire_at is not null
      and julianday(k.expire_at) > julianday(?)
      and julianday(k.expire_at) <= julianday(?) + w.expiring_days
      and not exists (
          select 1 from webhook_expiry_warnings x
          where x.webhook_id = w.id and x.key_id = k.id and x.expire_at = k.expire_at)
    order by k.organization_id, k.id
    limit ?
    """,
    """
    select w.id as webhook_id, k.id as key_id, k.organization_id, k.expire_at
    from webhooks w join api_keys k on k.organization_id = w.organization_id
    where w.events::jsonb @> '["key.expiring"]'::jsonb
      and w.disabled_at is null and k.state = 'enabled' and k.expire_at is not null
      and k.expire_at::timestamptz > ?::text::timestamptz
      and k.expire_at::timestamptz
          <= ?::text::timestamptz + make_interval(days => w.expiring_days::int)
      and not exists (
          select 1 from webhook_expiry_warnings x
          where x.webhook_id = w.id and x.key_id = k.id and x.expire_at = k.expire_at)
    order by k.organization_id, k.id
    limit ?
    """,
)
# Finished deliveries past KEEP_SECONDS, a bounded number at a time (their attempts go
# with them: on delete cascade).
ANY_TO_PRUNE = """
    select 1 from webhook_deliveries where state <> 'pending' and give_up_at < ? limit 1
"""
PRUNE = """
    delete from webhook_deliveries where seq in (
        select seq from webhook_deliveries
        where state <> 'pending' and give_up_at < ? order by give_up_at limit ?)
"""
WARNED = """
    insert into webhook_expiry_warnings (webhook_id, key_id, expire_at) values (?, ?, ?)
    on conflict do nothing
"""


@dataclass(frozen=True)
class Due:
    """A delivery leased for an attempt, with what the attempt needs."""

    seq: int
    event_id: str
    event_type: str
    body: str
    attempts: int
    give_up_at: float
    url: str
    nonce: bytes
    id: str
    webhook_id: str
    mac: bytes | None
    organization_id: str
    secret_version: int
    # The webhook's previous secret, which signs too until previous_until (unix seconds).
    previous_nonce: bytes | None = None
    previous_secret_version: int | None = None
    previous_until: float | None = None


@dataclass(frozen=True)
class Expiring:
    webhook_id: str
    key_id: str
    organization_id: str
    expire_at: str


def event_body(
    event_id: str, event_type: str, organization_id: str, data: dict[str, Any], now: datetime
) -> str:
    """The JSON a receiver is sent, as it is signed."""
    return json.dumps(
        {
            "id": event_id,
            "type": event_type,
            "createdAt": to_text(now),
            "organizationId": organization_id,
            "data": data,
        },
        separators=(",", ":"),
    )


def _rows(
    seal: Seal,
    webhooks: Sequence[tuple[str, str]],
    organization_id: str,
    event_type: str,
    data: dict[str, Any],
    now: datetime,
) -> list[tuple[object, ...]]:
    """One delivery row per webhook (ID, URL), all of one event: due now, given up a
    day later, each with its MAC."""
    if not webhooks:
        return []
    event_id = str(uuid.uuid4())
    body = event_body(event_id, event_type, organization_id, data, now)
    at = now.timestamp()
    rows: list[tuple[object, ...]] = []
    for webhook_id, url in webhooks:
        delivery_id = str(uuid.uuid4())
        mac = seal.of(delivery_id, webhook_id, organization_id, url, event_id, event_type, body)
        rows.append((delivery_id, webhook_id, event_id, event_type, body, to_text(now),
                     at + RETRY_FOR_SECONDS, at, mac))  # fmt: skip
    return rows


def _size(rows: Sequence[tuple[object, ...]]) -> int:
    """The bytes of delivery bodies ``rows`` store, as the write budget counts them."""
    return sum(len(str(row[4])) for row in rows)


async def enqueue(
    conn: Connection,
    seal: Seal,
    quota: Quota,
    organization_id: str,
    event_type: str,
    data: dict[str, Any],
    now: datetime,
    webhook_ids: Collection[str] | None = None,
    revoking: bool = False,
) -> None:
    """Inside the write's transaction: the event, for each of the organization's
    webhooks subscribed to ``event_type`` (among ``webhook_ids``, when given); a
    revocation's within the quota's reserve, never refused (``keysvc.db.quota``)."""
    subscribed = [
        (row[0], row[1])
        for row in await fetch_all(conn, SUBSCRIBERS, (organization_id, event_type))
        if webhook_ids is None or row[0] in webhook_ids
    ]
    if not subscribed:
        return
    admitted = set(
        await quota_sql.admit(conn, quota, [webhook_id for webhook_id, _ in subscribed], revoking)
    )
    subscribed = [(webhook_id, url) for webhook_id, url in subscribed if webhook_id in admitted]
    rows = _rows(seal, subscribed, organization_id, event_type, data, now)
    if rows:
        at = now.timestamp()
        await quota_sql.charge(conn, quota, organization_id, _size(rows), at, revoking)
        await conn.executemany(INSERT_DELIVERY, rows)


def enqueue_now(
    conn: sqlite3.Connection,
    seal: Seal,
    quota: Quota,
    event_type: str,
    events: Sequence[tuple[str, dict[str, Any], datetime]],
) -> None:
    """``enqueue`` on a synchronous connection, inside its transaction, for several
    events of one type at once, each (organization, data, time): one read and one
    insert whatever their number, as a create batch needs."""
    orgs = json.dumps(list(dict.fromkeys(org for org, _, _ in events)))
    subscribed: dict[str, list[tuple[str, str]]] = {}
    for webhook_id, org, url in conn.execute(SUBSCRIBERS_OF, (orgs, event_type)):
        subscribed.setdefault(org, []).append((webhook_id, url))
    rows = []
    for org, data, now in events:
        made = _rows(seal, subscribed.get(org, ()), org, event_type, data, now)
        if made:
            quota_sql.admit_now(conn, quota, [webhook_id for webhook_id, _ in subscribed[org]])
            quota_sql.charge_now(conn, quota, org, _size(made), now.timestamp())
        rows += made
    if rows:
        conn.executemany(INSERT_DELIVERY, rows)


async def any_due(conn: Connection, now: float, per_org: int) -> bool:
    """Whether ``claim`` would find an attempt to make (a read, to spare a write
    transaction when every due delivery waits on its webhook or organization)."""
    return await fetch_one(conn, DUE, (now, now, now, per_org, 1)) is not None


async def claim(
    conn: Connection, now: float, lease_until: float, owner: str, limit: int, per_org: int
) -> list[Due]:
    """Inside a write transaction: up to ``limit`` due deliveries nobody holds, chosen
    fairly (``DUE``: one per webhook, at most ``per_org`` under way per organization,
    round the organizations), leased to ``owner`` until ``lease_until`` so that no
    other process attempts them, nor another of their webhook's, meanwhile."""
    rows = await fetch_all(conn, DUE, (now, now, now, per_org, limit))
    if rows:
        seqs = json.dumps([row["seq"] for row in rows])
        await conn.execute(LEASE, (lease_until, owner, seqs))
    return [
        Due(row["seq"], row["event_id"], row["event_type"], row["body"], row["attempts"],
            row["give_up_at"], row["url"], row["nonce"], row["id"], row["webhook_id"],
            row["mac"], row["organization_id"], row["secret_version"], row["previous_nonce"],
            row["previous_secret_version"], row["previous_until"])
        for row in rows
    ]  # fmt: skip


async def record(
    conn: Connection,
    due: Due,
    owner: str,
    at: datetime,
    status: int | None,
    error: str | None,
    state: str,
    next_attempt_at: float | None,
) -> None:
    """Inside a write transaction: one attempt's outcome, unless the lease was lost
    (the webhook deleted meanwhile, or the lease run out and taken by another)."""
    await conn.execute(RECORD_ATTEMPT, (to_text(at), status, error, due.seq, owner))
    await conn.execute(FINISH_ATTEMPT, (state, next_attempt_at, due.seq, owner))


async def release(conn: Connection, owner: str) -> None:
    """Inside a write transaction: give back what ``owner`` leased, for another to attempt."""
    await conn.execute(RELEASE, (owner,))


async def expiring(conn: Connection, now: datetime, limit: int) -> list[Expiring]:
    text = to_text(now)
    rows = await fetch_all(conn, EXPIRING, (text, text, limit))
    return [
        Expiring(row["webhook_id"], row["key_id"], row["organization_id"], row["expire_at"])
        for row in rows
    ]


async def warned(conn: Connection, webhook_id: str, key_id: str, expire_at: str) -> bool:
    """Inside a write transaction: remember the warning; False if it was already sent."""
    cursor = await conn.execute(WARNED, (webhook_id, key_id, expire_at))
    return cursor.rowcount > 0


def _prune_cutoff(now: float) -> float:
    return now - KEEP_SECONDS + RETRY_FOR_SECONDS  # give_up_at is the event's time plus a day


async def any_to_prune(conn: Connection, now: float) -> bool:
    return await fetch_one(conn, ANY_TO_PRUNE, (_prune_cutoff(now),)) is not None


async def prune(conn: Connection, now: float) -> int:
    """Inside a write transaction: drop up to PRUNED_PER_TRANSACTION finished deliveries
    whose event is more than KEEP_SECONDS old; how many went."""
    cursor = await conn.execute(PRUNE, (_prune_cutoff(now), PRUNED_PER_TRANSACTION))
    return cursor.rowcount
