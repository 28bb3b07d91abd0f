"""The activity log's SQL and its hash chains: ``record``, the one function every
write calls inside its own transaction to log what it did, the reads of the log,
and ``verify``, which walks every organization's chain and then replays it against
the live tables (``keysvc.db.replay``).

Each organization's records are chained: a record's hash is an HMAC, keyed with
a key derived from the pepper (``Chain``), of its content and of the hash of the
record before it. The organization's head (its count and last hash, with an HMAC
of both) is rewritten with every record, so that removing the last records is
caught as well as editing or removing any other. Someone who can write the
database but not read the pepper cannot make a chain that verifies.

``record`` takes either connection keysvc writes with: the store's (aiosqlite)
or the create batches' own (``keysvc.db.sqlite.createbatch``, sqlite3, on the loop).
The write lock both hold makes one order of records per organization.
"""

import hashlib
import hmac
import json
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from keysvc.db import quota as quota_sql
from keysvc.db import replay
from keysvc.db.contract import Connection
from keysvc.db.dialect import with_json_list
from keysvc.db.quota import UNLIMITED, Quota
from keysvc.db.statements import fetch_all, fetch_one, many_row_statements, many_rows
from keysvc.models import Activity, ActivityKinds, ActivityPage, Actor, JsonText
from keysvc.timeutil import from_text, to_text

GENESIS = bytes(32)  # the prev_hash of an organization's first record

_INSERT = """
    insert into activities (id, organization_id, org_seq, created_at, type, key_update_type,
                            actor_type, actor_id, actor_ip, user_agent, actor_details,
                            target_key_id, target_role_id, before, after, prev_hash, hash)
    values """
_WIDTH = 17  # the columns of _INSERT
ROWS_PER_INSERT = 500  # rows of _INSERT a statement; SQLite takes up to 32,766 parameters
_HEADS_OF = with_json_list("""
    select organization_id, count, last_hash from activity_heads
    where organization_id in {json_list}
""")
_INSERT_HEADS = "insert into activity_heads (organization_id, count, last_hash, mac) values "
_ON_CONFLICT = """
    on conflict (organization_id) do update
    set count = excluded.count, last_hash = excluded.last_hash, mac = excluded.mac
"""
_BY_ID = """
    select id, organization_id, org_seq, created_at, type, key_update_type, actor_type,
           actor_id, actor_ip, user_agent, actor_details, target_key_id, target_role_id,
           before, after
    from activities where id = ? and organization_id = ?
"""
_PAGE_HEAD = """
    select id, organization_id, org_seq, created_at, type, key_update_type, actor_type,
           actor_id, actor_ip, user_agent, actor_details, target_key_id, target_role_id,
           before, after
    from activities {index} where organization_id = ? and org_seq > ?"""
# A date filter reads the time index: the organization's records of those dates, not
# all of them (SQLite is told so, as it would rather keep org_seq's order).
_DATED = " and created_at >= ? and created_at <= ?"
# The bounds of an open side of a date filter: every record's time sorts between them.
_EARLIEST, _LATEST = "", "~"
# With an ``ActivityKinds`` (its two lists as JSON arrays; else nulls): only the records
# of its types whose keyUpdateType, when they have one, it lists.
_KINDS = (
    " and (? is null or (type in {json_list}"
    " and (key_update_type is null or key_update_type in {json_list})))"
)
_KINDS_PG = _KINDS.replace("(? is null", "(?::text is null")
_ORDER = " order by org_seq limit ?"
_PAGE = with_json_list(
    _PAGE_HEAD.format(index="") + _KINDS + _ORDER,
    _PAGE_HEAD.format(index="") + _KINDS_PG + _ORDER,
)
PAGE_DATED = with_json_list(
    _PAGE_HEAD.format(index="indexed by activities_org_time") + _DATED + _KINDS + _ORDER,
    # org_seq + 0: PostgreSQL too would rather read org_seq's index.
    _PAGE_HEAD.format(index="").replace("org_seq > ?", "org_seq + 0 > ?")
    + _DATED
    + _KINDS_PG
    + _ORDER,
)
# Counted from the time index alone, which holds every column the filters test.
_COUNT_HEAD = """
    select count(*) from activities
    where organization_id = ? and created_at >= ? and created_at <= ?"""
COUNT = with_json_list(_COUNT_HEAD + _KINDS, _COUNT_HEAD + _KINDS_PG)
# The records an organization holds: its head's count, less those pruned.
_HEAD_COUNT = """
    select h.count - coalesce((select a.first_seq - 1 from activity_anchors a
                               where a.organization_id = h.organization_id), 0)
    from activity_heads h where h.organization_id = ?
"""
# What a record weighs in a page beyond its stored text: its IDs, names and time.
RECORD_OVERHEAD = 400
_WALK = """
    select id, organization_id, org_seq, created_at, type, key_update_type, actor_type,
           actor_id, actor_ip, user_agent, actor_details, target_key_id, target_role_id,
           before, after, prev_hash, hash
    from activities order by organization_id, org_seq
"""
_HEADS = "select organization_id, count, last_hash, mac from activity_heads"
_ANCHORS = "select organization_id, first_seq, prev_hash, state, mac from activity_anchors"
_UNHEADED = """
    select id from organizations
    where id not in (select organization_id from activity_heads) order by created_at
"""
_ORGANIZATIONS = "select id from organizations"

Writing = Connection | sqlite3.Connection


class Chain:
    """The key the chains are made with, derived from the pepper; set once the pepper
    is known (``Store.key_activities``)."""

    def __init__(self, key: bytes | None = None, quota: Quota = UNLIMITED):
        self._key = key
        # The organizations' write budget the records are charged to (keysvc.db.quota).
        self.quota = quota

    def keyed(self, key: bytes) -> None:
        self._key = key

    @property
    def is_keyed(self) -> bool:
        return self._key is not None

    def mac(self, *parts: bytes) -> bytes:
        if self._key is None:
            raise RuntimeError("the activity chain has no key: the pepper was not loaded")
        return hmac.new(self._key, b"\0".join(parts), hashlib.sha256).digest()

    def link(self, prev_hash: bytes, content: Sequence[object]) -> bytes:
        """The hash of a record of ``content`` (its columns, in order) after ``prev_hash``."""
        text = json.dumps(list(content), ensure_ascii=True, separators=(",", ":"))
        return self.mac(b"activity", prev_hash, text.encode())

    def headmac(self, organization_id: str, count: int, last_hash: bytes) -> bytes:
        return self.mac(b"head", organization_id.encode(), str(count).encode(), last_hash)


async def _all(conn: Writing, sql: str, params: Sequence[object]) -> list[Any]:
    if isinstance(conn, sqlite3.Connection):
        return conn.execute(sql, params).fetchall()
    return list(await fetch_all(conn, sql, params))


async def _run(conn: Writing, sql: str, params: Sequence[object]) -> None:
    if isinstance(conn, sqlite3.Connection):
        conn.execute(sql, params)
    else:
        await conn.execute(sql, params)


def stamp(moment: datetime) -> str:
    """A record's time with its microseconds always written, so that the text sorts in
    time order and the date filters can compare it (``to_text`` drops a zero fraction,
    and "...00Z" sorts after "...00.5Z")."""
    return to_text(moment, fraction=True)


def _json(value: object) -> str | None:
    if isinstance(value, JsonText):
        return value.text
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def json_text(value: object) -> str:
    """``value`` as an activity's ``before`` or ``after`` is stored (``JsonText``)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _content(activity: Activity, org_seq: int) -> tuple[object, ...]:
    """The stored columns of ``activity`` at ``org_seq``, in ``_COLUMNS``'s order."""
    actor = activity.actor
    return (
        activity.id, activity.organization_id, org_seq, stamp(activity.created_at),
        activity.type, activity.key_update_type, actor.type, actor.id, actor.ip,
        actor.user_agent, actor.details, activity.target_key_id, activity.target_role_id,
        _json(activity.before), _json(activity.after),
    )  # fmt: skip


async def record(
    conn: Writing, chain: Chain, *activities: Activity, revoking: bool = False
) -> None:
    """Inside the write's transaction: append ``activities``, in order, to their
    organizations' chains and move the heads. The one way an activity is written;
    a few statements whatever their number (a create batch records its keys' at once).
    A revocation's are counted against the write budget but never refused by it."""
    if not activities:
        return
    orgs = list(dict.fromkeys(activity.organization_id for activity in activities))
    ends = {
        row[0]: (int(row[1]), bytes(row[2]))
        for row in await _all(conn, _HEADS_OF, (json.dumps(orgs),))
    }
    rows: list[tuple[object, ...]] = []
    for activity in activities:
        count, last = ends.get(activity.organization_id, (0, GENESIS))
        content = _content(activity, count + 1)
        digest = chain.link(last, content)
        rows.append((*content, last, digest))
        ends[activity.organization_id] = (count + 1, digest)
    for sql, values in many_row_statements(_INSERT, rows, ROWS_PER_INSERT):
        await _run(conn, sql, values)
    await _charge(conn, chain.quota, rows, activities[-1].created_at.timestamp(), revoking)
    heads = [(org, *ends[org], chain.headmac(org, *ends[org])) for org in orgs]
    sql = many_rows(_INSERT_HEADS, len(heads), 4) + _ON_CONFLICT
    await _run(conn, sql, [v for head in heads for v in head])


async def _charge(
    conn: Writing, quota: Quota, rows: Sequence[Sequence[object]], now: float, revoking: bool
) -> None:
    """Each organization's records' stored text, against its write budget."""
    sizes: dict[str, int] = {}
    for row in rows:
        org = str(row[1])
        sizes[org] = sizes.get(org, 0) + sum(len(v) for v in row if isinstance(v, str))
    for org, size in sizes.items():
        if isinstance(conn, sqlite3.Connection):
            quota_sql.charge_now(conn, quota, org, size, now)
        else:
            await quota_sql.charge(conn, quota, org, size, now, revoking)


async def unheaded(conn: Connection) -> list[str]:
    """The organizations without a chain head: those from before the log."""
    return [row[0] for row in await fetch_all(conn, _UNHEADED, ())]


async def seal(
    conn: Connection, chain: Chain, organization_id: str, existing: Sequence[Activity]
) -> None:
    """Inside a transaction: start an organization's chain with ``existing``, the records
    of the keys and roles it holds already, or with an empty head when it holds none;
    so that an organization whose records and head were all removed is caught, and
    that what existed before the log replays (``keysvc.db.replay``)."""
    if existing:
        await record(conn, chain, *existing)
        return
    mac = chain.headmac(organization_id, 0, GENESIS)
    await conn.execute(many_rows(_INSERT_HEADS, 1, 4), (organization_id, 0, GENESIS, mac))


def _activity(row: Sequence[Any]) -> Activity:
    (id_, org, org_seq, created_at, type_, update_type, actor_type, actor_id, actor_ip,
     user_agent, details, target_key, target_role, before, after) = row[:15]  # fmt: skip
    return Activity(
        organization_id=org,
        type=type_,
        actor=Actor(actor_type, actor_id, actor_ip, user_agent, details),
        created_at=from_text(created_at),
        key_update_type=update_type,
        target_key_id=target_key,
        target_role_id=target_role,
        before=None if before is None else json.loads(before),
        after=None if after is None else json.loads(after),
        id=id_,
        org_seq=org_seq,
    )


async def get(conn: Connection, organization_id: str, activity_id: str) -> Activity | None:
    row = await fetch_one(conn, _BY_ID, (activity_id, organization_id))
    return None if row is None else _activity(row)


async def page(
    conn: Connection,
    organization_id: str,
    after: int,
    limit: int,
    since: datetime | None,
    until: datetime | None,
    kinds: ActivityKinds | None = None,
    max_bytes: int | None = None,
) -> ActivityPage:
    """Oldest first, after the organization's ``after``-th record, created within
    ``since`` to ``until`` (both included, either open), of ``kinds`` (None: every
    record); at most ``limit`` records, and no more than ``max_bytes`` of them (always
    one). ``total`` counts the records of those dates and kinds."""
    dated = since is not None or until is not None
    low = _EARLIEST if since is None else stamp(since)
    high = _LATEST if until is None else stamp(until)
    types = None if kinds is None else json.dumps(kinds.types)
    updates = None if kinds is None else json.dumps(kinds.update_types)
    sorts = (types, types, updates)
    if dated:
        rows = await fetch_all(
            conn, PAGE_DATED, (organization_id, after, low, high, *sorts, limit + 1)
        )
    else:
        rows = await fetch_all(conn, _PAGE, (organization_id, after, *sorts, limit + 1))
    if not dated and kinds is None:
        counted = await fetch_one(conn, _HEAD_COUNT, (organization_id,))
    else:
        counted = await fetch_one(conn, COUNT, (organization_id, low, high, *sorts))
    total = 0 if counted is None else int(counted[0])
    found = _within(rows[:limit], max_bytes)
    return ActivityPage(found, len(rows) > len(found), total)


def _within(rows: Sequence[Sequence[Any]], max_bytes: int | None) -> list[Activity]:
    """The records of ``rows``, up to the first that would take the page past
    ``max_bytes`` (the first record always)."""
    found: list[Activity] = []
    size = 0
    for row in rows:
        size += RECORD_OVERHEAD + sum(len(v) for v in row[9:] if isinstance(v, str))
        if found and max_bytes is not None and size > max_bytes:
            break
        found.append(_activity(row))
    return found


# What ``keysvc audit verify`` says on either backend when it cannot check.
OLD_SCHEMA = (
    "its schema is older than this keysvc's; start `keysvc serve` on it once to"
    " upgrade it, then verify"
)
WRONG_PEPPER = (
    "the pepper does not match this database: give the pepper file or"
    " KEYSVC_PEPPER that was used with it"
)


@dataclass(frozen=True)
class Verdict:
    """What ``verify`` found: the first problem (None when every chain holds), and
    how many records and organizations it walked."""

    problem: str | None
    records: int
    organizations: int


def _walk(
    conn: sqlite3.Connection, chain: Chain, starts: dict[str, tuple[int, bytes]]
) -> Iterator[tuple[str, int, bytes] | str]:
    """Each organization's end (its ID, count and last hash) as the records say, from
    its anchor's start when it was pruned (``starts``); or a problem, the first of
    which ends the walk."""
    org: str | None = None
    count, last = 0, GENESIS
    for row in conn.execute(_WALK):
        content, prev_hash, digest = tuple(row[:15]), bytes(row[15]), bytes(row[16])
        if row[1] != org:
            if org is not None:
                yield org, count, last
            org = row[1]
            count, last = starts.get(row[1], (0, GENESIS))
        where = f"activity {row[0]} (organization {row[1]}, record {row[2]})"
        if row[2] != count + 1:
            yield f"{where}: expected record {count + 1} here: records were removed or moved"
            return
        if not hmac.compare_digest(prev_hash, last):
            yield f"{where}: does not follow the record before it"
            return
        if not hmac.compare_digest(chain.link(last, content), digest):
            yield f"{where}: its content does not match its hash: it was edited"
            return
        count, last = count + 1, digest
    if org is not None:
        yield org, count, last


def verify(conn: sqlite3.Connection, chain: Chain) -> Verdict:
    """Walk every organization's chain and compare its end with its head, all in one
    read transaction: keysvc may commit while this runs, and reads of separate
    snapshots (heads from before a write, records from after it) would disagree."""
    conn.execute("begin")
    try:
        return _verify(conn, chain)
    finally:
        conn.execute("rollback")


def _starts(conn: sqlite3.Connection, chain: Chain) -> dict[str, tuple[int, bytes]] | str:
    """Where each pruned organization's chain starts now (the count before its first
    record kept, and that record's prev_hash), from its anchor; or a problem."""
    starts: dict[str, tuple[int, bytes]] = {}
    for org, first_seq, prev_hash, state, mac in conn.execute(_ANCHORS):
        made = chain.mac(
            b"anchor", org.encode(), str(first_seq).encode(), bytes(prev_hash), state.encode()
        )
        if not hmac.compare_digest(made, bytes(mac)):
            return f"organization {org}: its chain's anchor (where pruning left it) was edited"
        starts[org] = (int(first_seq) - 1, bytes(prev_hash))
    return starts


def _verify(conn: sqlite3.Connection, chain: Chain) -> Verdict:
    heads = {row[0]: (int(row[1]), bytes(row[2]), bytes(row[3])) for row in conn.execute(_HEADS)}
    starts = _starts(conn, chain)
    if isinstance(starts, str):
        return Verdict(starts, 0, 0)
    records, seen = 0, set[str]()
    for end in _walk(conn, chain, starts):
        if isinstance(end, str):
            return Verdict(end, records, len(seen))
        org, count, last = end
        seen.add(org)
        records += count - starts.get(org, (0, GENESIS))[0]
        problem = _check_head(chain, org, heads.get(org), count, last)
        if problem is not None:
            return Verdict(problem, records, len(seen))
    organizations = {row[0] for row in conn.execute(_ORGANIZATIONS)}
    for org in sorted((set(heads) | organizations) - seen):
        problem = _check_head(chain, org, heads.get(org), *starts.get(org, (0, GENESIS)))
        if problem is not None:
            return Verdict(problem, records, len(seen))
        seen.add(org)
    return Verdict(replay.check(conn), records, len(seen))


def _check_head(
    chain: Chain,
    org: str,
    head: tuple[int, bytes, bytes] | None,
    count: int,
    last: bytes,
) -> str | None:
    if head is None:
        return f"organization {org}: its chain has no head: records or the head were removed"
    head_count, head_hash, mac = head
    if not hmac.compare_digest(chain.headmac(org, head_count, head_hash), mac):
        return f"organization {org}: its chain head was edited"
    if head_count != count or not hmac.compare_digest(head_hash, last):
        return (
            f"organization {org}: the chain ends at record {count} but its head says"
            f" {head_count}: the last records were removed"
        )
    return None
