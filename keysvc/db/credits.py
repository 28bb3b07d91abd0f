"""All SQL about credits on keys (issue 29) and on identities (issue 36), and the spend
the store runs (``Store.spend_credits``): a key's credits, and its identity's, read and
written in one write transaction, each write a compare-and-set on what was read.

A spend is exact because it runs in a write transaction, which both backends
serialize (SQLite: ``begin immediate`` on the file, across processes; PostgreSQL: the
advisory write lock, across instances); the update names the remaining it read as
well, so that a write that were ever let in between would make it fail, not add up.
The rule (what a spend leaves, the events it sends) is the domain's, given as a
function of the credits read (``keysvc.domain.credits.spent``).
"""

import json
from collections.abc import Sequence
from typing import Any

from keysvc.db.contract import Connection
from keysvc.db.dialect import with_json_list
from keysvc.db.keys import credits_params
from keysvc.db.rows import credits_flags, credits_from_row
from keysvc.db.spendbatch import Pending
from keysvc.db.statements import fetch_all
from keysvc.errors import Conflict
from keysvc.models import Credits, Spent

# Never seen: a spend's write runs under the write lock it read in.
CREDITS_MOVED = "the key's credits changed while this request ran; try again"
# The compare-and-set: only over the remaining that was read.
WRITE_SPENT = """
    update key_details set credits_remaining = ?, credits_refill_interval = ?,
                           credits_refill_amount = ?, credits_refill_day = ?,
                           credits_next_refill = ?, credits_base = ?, credits_flags = ?
    where key_id = ? and credits_remaining = ?
"""


async def write_many(
    conn: Connection, writes: Sequence[tuple[str, Credits, Credits]], sql: str = WRITE_SPENT
) -> bool:
    """Each (key, credits read, credits after) written over the credits read (the
    compare-and-set), in one call; False if the driver counts fewer rows written than
    asked (SQLite counts; PostgreSQL's executemany does not, and the write lock held is
    the guarantee)."""
    if not writes:
        return True
    rows = [
        (*credits_params(after), credits_flags(after), key_id, read.remaining)
        for key_id, read, after in writes
    ]
    done = await conn.executemany(sql, rows)
    count = getattr(done, "rowcount", None)
    return not isinstance(count, int) or count < 0 or count == len(rows)


# The credits of an organization's identities, by their externalIds (keys' identities),
# in one statement (keysvc.db.spendbatch).
IDENTITY_CREDITS_OF_MANY = with_json_list("""
    select id, external_id, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags
    from identities
    where organization_id = ? and external_id in {json_list} and credits_remaining is not null
""")
# A batch's keys' credits and those of one organization's identities, in one statement:
# a key's row has no external_id, an identity's always has one.
CREDITS_OF_BATCH = with_json_list("""
    select key_id as id, null as external_id, credits_remaining, credits_refill_interval,
           credits_refill_amount, credits_refill_day, credits_next_refill, credits_base,
           credits_flags
    from key_details where key_id in {json_list} and credits_remaining is not null
    union all
    select id, external_id, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags
    from identities
    where organization_id = ? and external_id in {json_list} and credits_remaining is not null
""")
WRITE_IDENTITY_SPENT = WRITE_SPENT.replace("key_details", "identities").replace("key_id =", "id =")
# A credit event to send: (organization, type, data, time).
Event = tuple[str, str, dict[str, Any], Any]
_Owner = tuple[str, str]  # ("key", key UUID) or ("identity", identity UUID)


# Read for a batch: each key's credits by its UUID; each identity's UUID and credits by
# (organization, externalId). Absent: none, or unlimited ones.
_Read = tuple[dict[str, Credits], dict[tuple[str, str], tuple[str, Credits]]]


async def _batch_credits(conn: Connection, batch: Sequence[Pending]) -> _Read:
    """The credits of the batch's keys and of the identities its shared spends name: one
    statement for the keys and the first organization's identities (a batch's spends are
    mostly of one), one more for each other organization's."""
    named: dict[str, dict[str, None]] = {}
    for p in batch:
        if p.external_id is not None:
            named.setdefault(p.organization_id, {})[p.external_id] = None
    keys: dict[str, Credits] = {}
    found: dict[tuple[str, str], tuple[str, Credits]] = {}
    organizations = list(named) or [""]  # "": no identity asked for, the keys alone
    key_ids = json.dumps(list(dict.fromkeys(p.key_id for p in batch)))
    first = organizations[0]
    params = (key_ids, first, json.dumps(list(named.get(first, ()))))
    for row in await fetch_all(conn, CREDITS_OF_BATCH, params):
        credits = credits_from_row(row)
        if credits is None:
            continue
        if row["external_id"] is None:
            keys[row["id"]] = credits
        else:
            found[(first, row["external_id"])] = (row["id"], credits)
    for organization_id in organizations[1:]:
        more = (organization_id, json.dumps(list(named[organization_id])))
        for row in await fetch_all(conn, IDENTITY_CREDITS_OF_MANY, more):
            credits = credits_from_row(row)
            if credits is not None:
                found[(organization_id, row["external_id"])] = (row["id"], credits)
    return keys, found


async def spend_batch(
    conn: Connection, batch: Sequence[Pending]
) -> tuple[list[Spent], list[Event]]:
    """A batch's spends in order, inside the write transaction ``conn`` is in: the keys'
    and the identities' credits read together (``_batch_credits``), each rule given what
    the ones before it left, a spend from a key and its identity made only if both allow
    it, the results written (compare-and-set); the answers and the events to send."""
    read_keys, identities = await _batch_credits(conn, batch)
    read: dict[_Owner, Credits] = {("key", k): c for k, c in read_keys.items()}
    read.update({("identity", i): c for i, c in identities.values()})
    current = dict(read)
    answers: list[Spent] = []
    events: list[Event] = []
    for pending in batch:
        key_owner: _Owner = ("key", pending.key_id)
        key_credits = current.get(key_owner)
        own = None if key_credits is None else pending.rule(key_credits)
        shared, external_id = None, pending.external_id
        identity_owner: _Owner | None = None
        if external_id is not None and pending.identity_rule is not None:
            found = identities.get((pending.organization_id, external_id))
            if found is not None:
                identity_owner = ("identity", found[0])
                shared = pending.identity_rule(current[identity_owner])
        # Both owners' rules allow it, or neither is spent: a refusing owner keeps what
        # its rule left (a due refill, its events), the other what it had.
        allowed = (own is None or own.allowed) and (shared is None or shared.allowed)
        for owner, spend in ((key_owner, own), (identity_owner, shared)):
            if owner is not None and spend is not None and (allowed or not spend.allowed):
                current[owner] = spend.credits
                for event_type, data in spend.events:
                    events.append((pending.organization_id, event_type, data, pending.now))
        answers.append(Spent(own, shared))
    changed = [(owner, after) for owner, after in current.items() if after != read[owner]]
    keys = [(uuid, read[(kind, uuid)], after) for (kind, uuid), after in changed if kind == "key"]
    shares = [(uuid, read[(kind, uuid)], after) for (kind, uuid), after in changed if kind != "key"]
    written = await write_many(conn, keys)
    if not (await write_many(conn, shares, WRITE_IDENTITY_SPENT) and written):
        raise Conflict(CREDITS_MOVED)
    return answers, events
