"""Activity retention: the records older than the retention pruned from the start of
each organization's chain, in the background, with what ``keysvc audit verify`` needs
kept in the organization's anchor (``activity_anchors``).

An anchor holds the first record kept, the hash of the record before it, and the keys
and custom roles the pruned records left (``keysvc.db.replay``'s state), with an HMAC
of all of them keyed like the chain. Verify walks each chain from its anchor and
replays from the anchor's state, so a pruned log verifies as an unpruned one does.
What it can no longer say is what the pruned records held: removing records from a
chain's start is what pruning does, and an anchor cannot be made without the pepper,
so a writer without it can neither prune nor move an anchor back.
"""

import json
from datetime import datetime
from typing import Any

from keysvc.db import replay
from keysvc.db.activities import Chain, stamp
from keysvc.db.contract import Connection
from keysvc.db.statements import fetch_all, fetch_one

# Records pruned in one transaction, so that a prune never holds the write lock long.
PRUNED_PER_TRANSACTION = 1000

_OLDEST = """
    select organization_id, max(org_seq) from activities
    where created_at < ? group by organization_id order by organization_id limit 1
"""
_ANCHOR = "select first_seq, prev_hash, state, mac from activity_anchors where organization_id = ?"
_RECORDS = """
    select organization_id, type, target_key_id, target_role_id, after, org_seq, hash
    from activities where organization_id = ? and org_seq <= ? order by org_seq limit ?
"""
_DELETE = "delete from activities where organization_id = ? and org_seq < ?"
_SAVE = """
    insert into activity_anchors (organization_id, first_seq, prev_hash, state, mac)
    values (?, ?, ?, ?, ?)
    on conflict (organization_id) do update
    set first_seq = excluded.first_seq, prev_hash = excluded.prev_hash,
        state = excluded.state, mac = excluded.mac
"""


def anchor_mac(chain: Chain, org: str, first_seq: int, prev_hash: bytes, state: str) -> bytes:
    """The anchor's HMAC, as ``keysvc.db.activities.verify`` checks it."""
    return chain.mac(b"anchor", org.encode(), str(first_seq).encode(), prev_hash, state.encode())


async def prune(conn: Connection, chain: Chain, before: datetime) -> int:
    """Inside a transaction: up to PRUNED_PER_TRANSACTION records created before
    ``before``, of one organization, from its chain's start; the anchor moved past
    them. How many were pruned (0: nothing is left to prune)."""
    oldest = await fetch_one(conn, _OLDEST, (stamp(before),))
    if oldest is None:
        return 0
    org, last = str(oldest[0]), int(oldest[1])
    state: dict[str, Any] = {"keys": {}, "roles": {}}
    anchor = await fetch_one(conn, _ANCHOR, (org,))
    if anchor is not None:
        text = str(anchor[2])
        if anchor_mac(chain, org, int(anchor[0]), bytes(anchor[1]), text) != bytes(anchor[3]):
            raise RuntimeError(f"organization {org}: its activity anchor was edited; not pruned")
        state = json.loads(text)
    rows = await fetch_all(conn, _RECORDS, (org, last, PRUNED_PER_TRANSACTION))
    if not rows:
        return 0
    kept = replay.restore(state)
    for row in rows:
        replay.apply(kept, tuple(row[:5]))
    first_seq, prev_hash = int(rows[-1][5]) + 1, bytes(rows[-1][6])
    text = json.dumps(replay.save(kept), sort_keys=True, separators=(",", ":"))
    await conn.execute(_DELETE, (org, first_seq))
    mac = anchor_mac(chain, org, first_seq, prev_hash, text)
    await conn.execute(_SAVE, (org, first_seq, prev_hash, text, mac))
    return len(rows)
