"""All SQL about keys, as plain text with ``?`` parameters.

Functions here run statements on the connection they are given, inside whatever
transaction the caller holds, and return records (``keysvc.db.rows``), never
cursors. Lists of IDs are passed as one JSON parameter and expanded with
``json_each``, so no SQL is ever built. A statement whose PostgreSQL form differs
carries it beside it (``keysvc.db.dialect``).
"""

import functools
import json
import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from keysvc.db.contract import Connection
from keysvc.db.dialect import Sql, with_json_list
from keysvc.db.rows import credits_flags, keys_with_roles
from keysvc.db.statements import fetch_all, fetch_one
from keysvc.errors import Conflict
from keysvc.models import Credential, Credits, Key, KeyChange, NewKey
from keysvc.timeutil import from_text, to_text

# The roles a batch of creates assigns, as they are inside its transaction.
GRANTED_ROLES = with_json_list("""
    select id, name, type, permissions, created_at, updated_at from roles
    where id in {json_list}
""")

KEY_BY_ID = """
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window, previous_until,
           external_id, meta, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags, ratelimits
    from api_keys left join key_details on key_details.key_id = api_keys.id
    where id = ? and organization_id = ?
"""
# Each key with the UUID of its identity (issue 36), in the page's one statement.
KEY_PAGE = """
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window, previous_until,
           external_id, meta, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags, ratelimits,
           (select identities.id from identities
            where identities.organization_id = api_keys.organization_id
              and identities.external_id = key_details.external_id) as identity_id
    from api_keys left join key_details on key_details.key_id = api_keys.id
    where organization_id = ? and org_seq > ? order by org_seq limit ?
"""
# A page of the keys with one externalId (the list's ?externalId=), and their count.
KEY_PAGE_EXTERNAL = KEY_PAGE.replace("org_seq > ? order", "external_id = ? and org_seq > ? order")
COUNT_EXTERNAL = """
    select count(*) from key_details join api_keys on api_keys.id = key_details.key_id
    where organization_id = ? and external_id = ?
"""
# The key a key ID's keyed hash belongs to, with the keyed hash of the secret that goes
# with that key ID: its current one, else the previous one a rotation left
# (credential_until says when that stops working). Both columns are unique, and no key
# is given another's previous key ID (schema.sql); were one edited in by hand, the
# current key ID would win. Last, a tombstone: its key's UUID, organization and secret
# hash, with placeholders for the columns a Key needs, so that a deleted key ID costs
# the same one statement as any other (docs/SECURITY.md); a deleted key's (previous = 2),
# or, while its key still exists, credentials a rotation replaced (previous = 3).
CREDENTIAL = """
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window, previous_until,
           external_id, meta, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags, ratelimits,
           secret_hash as credential_secret_hash, null as credential_until, 0 as previous
    from api_keys left join key_details on key_details.key_id = api_keys.id
    where key_id_hash = ?
    union all
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window, previous_until,
           external_id, meta, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags, ratelimits,
           previous_secret_hash, previous_until, 1
    from api_keys left join key_details on key_details.key_id = api_keys.id
    where previous_key_id_hash = ?
    union all
    select 0, 0, key_id, organization_id, '', 'deleted', '', deleted_at, null,
           null, '[]', null, null, null,
           null, null, null, null, null, null, null, null, 0, null,
           secret_hash, null,
           case when exists (select 1 from api_keys k where k.id = deleted_credentials.key_id)
                then 3 else 2 end
    from deleted_credentials where key_id_hash = ?
    order by previous limit 1
"""
# The point reads (keysvc.db.sqlite.pointreads): one statement each, a key's row with its roles'
# joined in, one row per role (the key's columns repeated; null role columns for a key
# holding none).
_WITH_ROLES = """
    select found.*,
           r.id as role_id, r.name as role_name, r.type as role_type,
           r.permissions as role_permissions, r.created_at as role_created_at,
           r.updated_at as role_updated_at
    from found
    left join key_roles kr on kr.key_id = found.id
    left join roles r on r.id = kr.role_id
    order by r.type = 'custom', r.name
"""
# CREDENTIAL's row, with its key's roles.
CREDENTIAL_JOINED = "with found as (" + CREDENTIAL + ")" + _WITH_ROLES
# KEY_BY_ID's row, with its key's roles.
KEY_BY_ID_JOINED = "with found as (" + KEY_BY_ID + ")" + _WITH_ROLES
ROLES_OF_KEYS = with_json_list("""
    select kr.key_id, r.id, r.name, r.type, r.permissions, r.created_at, r.updated_at
    from key_roles kr join roles r on r.id = kr.role_id
    where kr.key_id in {json_list}
    order by r.type = 'custom', r.name
""")
KEYS_WITH_IDS = with_json_list("""
    select seq, org_seq, id, organization_id, name, state, key_suffix, created_at, expire_at,
           used_at, ip_access_list, rate_limit, rate_window, previous_until,
           external_id, meta, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags, ratelimits
    from api_keys left join key_details on key_details.key_id = api_keys.id
    where id in {json_list} order by seq
""")
# The columns a new key's row is written with: a create's, and an import's staging
# (keysvc.db.imports), so that the two never differ.
KEY_COLUMNS = (
    "id, org_seq, organization_id, name, state, key_id_hash, secret_hash, key_suffix,"
    " ip_access_list, created_at, expire_at, rate_limit, rate_window"
)
KEY_VALUES = ", ".join("?" * len(KEY_COLUMNS.split(",")))
INSERT_KEY = f"insert into api_keys ({KEY_COLUMNS}) values ({KEY_VALUES})"  # noqa: S608 - constants
INSERT_KEY_ROLE = "insert into key_roles (key_id, role_id) values (?, ?)"
COUNT_KEYS = "select key_count from organizations where id = ?"
LAST_KEY_SEQ = "select last_key_seq from organizations where id = ?"
# The effective state, as authentication sees it: expired means enabled but past expireAt.
# julianday (PostgreSQL: a cast to timestamptz) compares the instants, whatever
# fraction of a second the text carries.
COUNT_KEYS_BY_STATE = Sql(
    """
    select case
               when state = 'disabled' then 'disabled'
               when expire_at is not null and julianday(expire_at) <= julianday(?) then 'expired'
               else 'enabled'
           end as effective,
           count(*) as n
    from api_keys group by effective
    """,
    """
    select case
               when state = 'disabled' then 'disabled'
               when expire_at is not null and expire_at::timestamptz <= ?::text::timestamptz
               then 'expired'
               else 'enabled'
           end as effective,
           count(*) as n
    from api_keys group by effective
    """,
)

# Whether a key ID is some key's, current or previous: a rotation's new one must be neither.
KEY_ID_IN_USE = """
    select 1 from api_keys where key_id_hash = ? or previous_key_id_hash = ? limit 1
"""
# A rotation: the current credentials become the previous ones until ``previous_until``
# (those kept before go at once), or, with no grace period, go at once themselves.
ROTATE_KEEPING = """
    update api_keys set previous_key_id_hash = key_id_hash, previous_secret_hash = secret_hash,
                        previous_until = ?, key_id_hash = ?, secret_hash = ?, key_suffix = ?
    where id = ?
"""
ROTATE_DROPPING = """
    update api_keys set previous_key_id_hash = null, previous_secret_hash = null,
                        previous_until = null, key_id_hash = ?, secret_hash = ?, key_suffix = ?
    where id = ?
"""

# CREDENTIAL's ``previous`` for a deleted key's tombstone, and for a rotated key's.
_TOMBSTONE = 2
_ROTATED = 3
# A rotated key's replaced credentials, kept as a tombstone from ``deleted_at`` (here
# when they stopped working) for as long as a deleted key's: their use is then refused
# as "rotated", not counted as a failed login (keysvc.http.auth). The current ones,
# when a rotation has no grace; the previous ones, when a rotation replaces them or
# their grace ends.
_ENTOMB = """
    insert into deleted_credentials (key_id_hash, secret_hash, key_id, organization_id, deleted_at)
    select {pair}, id, organization_id, {stamp} from api_keys where {where}
    on conflict (key_id_hash) do update
        set secret_hash = excluded.secret_hash, key_id = excluded.key_id,
            organization_id = excluded.organization_id, deleted_at = excluded.deleted_at
"""
_PREVIOUS_PAIR = "previous_key_id_hash, previous_secret_hash"
_PREVIOUS_KEPT = "previous_key_id_hash is not null and previous_secret_hash is not null"
ENTOMB_CURRENT = _ENTOMB.format(pair="key_id_hash, secret_hash", stamp="?", where="id = ?")
ENTOMB_PREVIOUS = _ENTOMB.format(
    pair=_PREVIOUS_PAIR, stamp="?", where=f"{_PREVIOUS_KEPT} and id = ?"
)
ENTOMB_ENDED = _ENTOMB.format(
    pair=_PREVIOUS_PAIR,
    stamp="previous_until",
    where=f"{_PREVIOUS_KEPT} and previous_until is not null and previous_until <= ?",
)
# Tombstones past their retention (deleted_credentials, schema.sql).
PRUNE_TOMBSTONES = Sql(
    "delete from deleted_credentials where julianday(deleted_at) < julianday(?)",
    "delete from deleted_credentials where deleted_at::timestamptz < ?::text::timestamptz",
)

# What a create or an update is told when a constraint refuses its key, by either path.
KEY_ID_TAKEN = "hashData.keyIdHash: a key with this key ID already exists"
ROLE_GONE = "a role was deleted while this request ran; try again"


async def keys_from_rows(
    conn: Connection, rows: Sequence[sqlite3.Row], *, even_none: bool = False
) -> list[Key]:
    """Keys with their roles, read with one query for the whole batch; with ``even_none``
    the roles' query runs for no row too, so that a miss runs the statements a hit runs
    (``Store.keys_with_secret``)."""
    if not rows and not even_none:
        return []
    ids = json.dumps([row["id"] for row in rows])
    return keys_with_roles(rows, await fetch_all(conn, ROLES_OF_KEYS, (ids,)))


async def get_key(conn: Connection, organization_id: str, key_id: str) -> Key | None:
    row = await fetch_one(conn, KEY_BY_ID, (key_id, organization_id))
    return None if row is None else (await keys_from_rows(conn, [row]))[0]


async def list_page(
    conn: Connection,
    organization_id: str,
    after: int,
    limit: int,
    external_id: str | None = None,
) -> tuple[list[Key], bool, int, dict[str, str]]:
    """Up to ``limit`` keys after ``after`` (``Key.org_seq``), whether there are more,
    and how many the organization holds; with ``external_id``, only its keys, and
    how many of them there are. Last, the identity of each key that has one, by key."""
    if external_id is None:
        rows = await fetch_all(conn, KEY_PAGE, (organization_id, after, limit + 1))
        total = await fetch_one(conn, COUNT_KEYS, (organization_id,))
    else:
        params = (organization_id, external_id, after, limit + 1)
        rows = await fetch_all(conn, KEY_PAGE_EXTERNAL, params)
        total = await fetch_one(conn, COUNT_EXTERNAL, (organization_id, external_id))
    keys = await keys_from_rows(conn, rows[:limit])
    identity_ids = {row["id"]: row["identity_id"] for row in rows[:limit] if row["identity_id"]}
    return keys, len(rows) > limit, total[0] if total else 0, identity_ids


def credential_of(key: Key, row: sqlite3.Row) -> Credential:
    """The credential that CREDENTIAL's ``row`` describes, for its key read as ``key``."""
    until = row["credential_until"]
    return Credential(
        key,
        row["credential_secret_hash"],
        from_text(until) if until else None,
        deleted=row["previous"] == _TOMBSTONE,
        rotated=row["previous"] == _ROTATED,
    )


def credential_params(key_id_hash: bytes) -> tuple[bytes, bytes, bytes]:
    """CREDENTIAL's parameters: the key-ID hash, for each of its branches."""
    return key_id_hash, key_id_hash, key_id_hash


async def key_id_in_use(conn: Connection, key_id_hash: bytes) -> bool:
    """Whether some key holds this keyed key-ID hash, as its current or previous key ID."""
    return await fetch_one(conn, KEY_ID_IN_USE, (key_id_hash, key_id_hash)) is not None


async def rotate_key(
    conn: Connection,
    key_id: str,
    key_id_hash: bytes,
    secret_hash: bytes,
    key_suffix: str,
    previous_until: datetime | None,
    now: datetime,
) -> None:
    """Give the key new credentials; its current ones keep working until
    ``previous_until``, or stop at once when it is None. Those that stop at ``now``
    are kept as tombstones (``ENTOMB_CURRENT``)."""
    await conn.execute(ENTOMB_PREVIOUS, (to_text(now), key_id))
    if previous_until is None:
        await conn.execute(ENTOMB_CURRENT, (to_text(now), key_id))
        await conn.execute(ROTATE_DROPPING, (key_id_hash, secret_hash, key_suffix, key_id))
    else:
        await conn.execute(
            ROTATE_KEEPING, (to_text(previous_until), key_id_hash, secret_hash, key_suffix, key_id)
        )


# A batch's keys share their creation time: its text is made once.
_created_text = functools.lru_cache(maxsize=16)(to_text)


def key_row(key_id: str, org_seq: int, new: NewKey) -> tuple[object, ...]:
    """INSERT_KEY's parameters for ``new``."""
    return (
        key_id,
        org_seq,
        new.organization_id,
        new.name,
        new.state,
        new.key_id_hash,
        new.secret_hash,
        new.key_suffix,
        json.dumps(new.ip_access_list) if new.ip_access_list else "[]",
        _created_text(new.created_at),
        to_text(new.expire_at) if new.expire_at else None,
        new.rate_limit[0] if new.rate_limit else None,
        new.rate_limit[1] if new.rate_limit else None,
    )


# A key's details (issue 29), written whole: a create's, a PATCH's, a credits change's.
INSERT_DETAILS = """
    insert into key_details (key_id, external_id, meta, credits_remaining,
                             credits_refill_interval, credits_refill_amount, credits_refill_day,
                             credits_next_refill, credits_base, credits_flags, ratelimits)
    values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
UPSERT_DETAILS = (
    INSERT_DETAILS
    + """
    on conflict (key_id) do update set
        external_id = excluded.external_id, meta = excluded.meta,
        credits_remaining = excluded.credits_remaining,
        credits_refill_interval = excluded.credits_refill_interval,
        credits_refill_amount = excluded.credits_refill_amount,
        credits_refill_day = excluded.credits_refill_day,
        credits_next_refill = excluded.credits_next_refill,
        credits_base = excluded.credits_base, credits_flags = excluded.credits_flags,
        ratelimits = excluded.ratelimits
"""
)


def details_row(
    key_id: str,
    external_id: str | None,
    meta: Mapping[str, Any] | None,
    credits: Credits | None,
    ratelimits: str | None = None,
) -> tuple[object, ...] | None:
    """INSERT_DETAILS's parameters; None when the key has none of them."""
    if external_id is None and meta is None and credits is None and ratelimits is None:
        return None
    flags = 0 if credits is None else credits_flags(credits)
    text = None if meta is None else json.dumps(meta)
    return (key_id, external_id, text, *credits_params(credits), flags, ratelimits)


async def write_details(
    conn: Connection,
    key_id: str,
    external_id: str | None,
    meta: Mapping[str, Any] | None,
    credits: Credits | None,
    ratelimits: str | None,
) -> None:
    """Store the key's details as given, inside the caller's transaction."""
    row = details_row(key_id, external_id, meta, credits, ratelimits)
    if row is None:
        await conn.execute("delete from key_details where key_id = ?", (key_id,))
    else:
        await conn.execute(UPSERT_DETAILS, row)


def credits_params(credits: Credits | None) -> tuple[object, ...]:
    """The credit columns for ``credits``, from credits_remaining to credits_base."""
    if credits is None:
        return (None,) * 6
    refill = credits.refill
    return (
        credits.remaining,
        None if refill is None else refill.interval,
        None if refill is None else refill.amount,
        None if refill is None else refill.day,
        None if credits.next_refill_at is None else to_text(credits.next_refill_at),
        credits.base,
    )


async def insert_key_roles(conn: Connection, key_id: str, role_ids: Sequence[str]) -> None:
    try:
        await conn.executemany(
            INSERT_KEY_ROLE, [(key_id, role_id) for role_id in dict.fromkeys(role_ids)]
        )
    except sqlite3.IntegrityError:
        raise Conflict(ROLE_GONE) from None


# Issue 36: the identity a key's externalId makes when its organization has none of that
# externalId yet, with no limits, in the key write's transaction (writes are serialized,
# so no two make one). Its parameters: ``identity_params``.
ENSURE_IDENTITY = """
    insert into identities (id, organization_id, org_seq, external_id, created_at, updated_at)
    select ?, ?, (select coalesce(max(org_seq), 0) + 1 from identities where organization_id = ?),
           ?, ?, ?
    where not exists (select 1 from identities where organization_id = ? and external_id = ?)
"""


def identity_params(organization_id: str, external_id: str, now: datetime) -> tuple[object, ...]:
    at = to_text(now)
    return (
        str(uuid.uuid4()), organization_id, organization_id, external_id, at, at,
        organization_id, external_id,
    )  # fmt: skip


async def ensure_identity(
    conn: Connection, organization_id: str, external_id: str | None, now: datetime
) -> None:
    """The key's identity made if its organization has none of ``external_id`` yet."""
    if external_id is not None:
        await conn.execute(ENSURE_IDENTITY, identity_params(organization_id, external_id, now))


async def insert_key(conn: Connection, new: NewKey) -> Key:
    """One key, outside the create batches (bootstrap's first key)."""
    key_id = str(uuid.uuid4())
    last = await fetch_one(conn, LAST_KEY_SEQ, (new.organization_id,))
    org_seq = (last[0] if last else 0) + 1
    try:
        await conn.execute(INSERT_KEY, key_row(key_id, org_seq, new))
    except sqlite3.IntegrityError as exc:
        if "key_id_hash" in str(exc):
            raise Conflict(KEY_ID_TAKEN) from None
        raise
    await insert_key_roles(conn, key_id, new.role_ids)
    details = details_row(key_id, new.external_id, new.meta, new.credits, new.ratelimits)
    if details is not None:
        await conn.execute(INSERT_DETAILS, details)
    await ensure_identity(conn, new.organization_id, new.external_id, new.created_at)
    key = await get_key(conn, new.organization_id, key_id)
    assert key is not None
    return key


async def update_key(conn: Connection, current: Key, change: KeyChange) -> None:
    """Write ``change`` over ``current``, its roles included when it names them."""
    expire_at = None if change.clear_expiry else change.expire_at or current.expire_at
    rate = None if change.clear_rate_limit else change.rate_limit or current.rate_limit
    ip_list = current.ip_access_list if change.ip_access_list is None else change.ip_access_list
    await conn.execute(
        "update api_keys set name = ?, state = ?, expire_at = ?, ip_access_list = ?,"
        " rate_limit = ?, rate_window = ? where id = ?",
        (
            change.name or current.name,
            change.state or current.state,
            to_text(expire_at) if expire_at else None,
            json.dumps(ip_list),
            rate[0] if rate else None,
            rate[1] if rate else None,
            current.id,
        ),
    )
    external_id = None if change.clear_external_id else change.external_id or current.external_id
    meta = None if change.clear_meta else change.meta if change.meta is not None else current.meta
    credits = change.credits if change.set_credits else current.credits
    limits = change.ratelimits if change.set_ratelimits else current.ratelimits
    details = (external_id, meta, credits, limits)
    if details != (current.external_id, current.meta, current.credits, current.ratelimits):
        await write_details(conn, current.id, *details)
    if change.role_ids is not None:
        await conn.execute("delete from key_roles where key_id = ?", (current.id,))
        await insert_key_roles(conn, current.id, change.role_ids)


async def delete_key(conn: Connection, organization_id: str, key_id: str) -> bool:
    """Delete the key; False if there was none."""
    cursor = await conn.execute(
        "delete from api_keys where id = ? and organization_id = ?", (key_id, organization_id)
    )
    return cursor.rowcount > 0


async def write_used_at(conn: Connection, minutes: Mapping[str, str]) -> None:
    """usedAt for each key UUID of ``minutes``, unless it is there already or later."""
    await conn.executemany(
        "update api_keys set used_at = ? where id = ? and (used_at is null or used_at < ?)",
        [(text, key_id, text) for key_id, text in minutes.items()],
    )


async def count_keys_by_state_on(conn: Connection, now: datetime) -> dict[str, int]:
    """``count_keys_by_state`` on an asynchronous connection (PostgreSQL's pool)."""
    counts = {"enabled": 0, "disabled": 0, "expired": 0}
    for row in await fetch_all(conn, COUNT_KEYS_BY_STATE, (to_text(now),)):
        counts[row["effective"]] = int(row["n"])
    return counts


def count_keys_by_state(conn: sqlite3.Connection, now: datetime) -> dict[str, int]:
    """Keys of all organizations by effective state: enabled, disabled, expired.

    A scan of every key: run it on a connection of its own, never on the Store's
    reader, which authentication waits on (``keysvc.db.keystates`` does).
    """
    counts = {"enabled": 0, "disabled": 0, "expired": 0}
    for row in conn.execute(COUNT_KEYS_BY_STATE, (to_text(now),)).fetchall():
        counts[row["effective"]] = row["n"]
    return counts


# A rotation's previous credentials once their grace has ended: refused already (each
# credential carries its end), so their hashes go; the trigger api_keys_previous_changed
# moves auth_generation, and the unique index lets the key ID go.
DROP_ENDED_PREVIOUS = """
    update api_keys set previous_key_id_hash = null, previous_secret_hash = null,
                        previous_until = null
    where previous_until is not null and previous_until <= ?
"""


async def drop_ended_previous(conn: Connection, now: datetime) -> None:
    """Forget the previous credentials of every key whose grace ended by ``now``, but
    as tombstones."""
    await conn.execute(ENTOMB_ENDED, (to_text(now),))
    await conn.execute(DROP_ENDED_PREVIOUS, (to_text(now),))


async def prune_tombstones(conn: Connection, before: datetime) -> None:
    """Forget the credentials of keys deleted before ``before``."""
    await conn.execute(PRUNE_TOMBSTONES, (to_text(before),))


def over_limit(max_keys: int) -> Conflict:
    return Conflict(f"this organization has reached its limit of {max_keys} keys")


# The keys whose secret has this keyed hash (``Store.keys_with_secret``): as their current
# secret (previous = 0), as a rotation's previous one while its grace lasts (previous =
# 1), or as a secret a rotation replaced and that no longer opens the key (previous = 2:
# its tombstone in deleted_credentials, kept for the retention, ``replaced_at`` when it
# stopped working; a deleted key's tombstones join no key). Each row with the hash it
# matched on, compared again by the caller in constant time, and whether this secret
# was reported leaked for the key before (leak_reports). The same three index seeks
# for a hit and a miss (api_keys_secret, api_keys_previous_secret,
# deleted_credentials_secret). A hashData client may give many keys one secret: at
# most LEAKED_KEYS_READ are read at a time, those not reported yet first, so that a
# report reads on until none is left.
LEAKED_KEYS_READ = 16
_HOLDER_COLUMNS = """
    select seq, org_seq, id, api_keys.organization_id, name, state, key_suffix, created_at,
           expire_at, used_at, ip_access_list, rate_limit, rate_window, previous_until,
           external_id, meta, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags, ratelimits,"""
_HOLDERS = f"""
    {_HOLDER_COLUMNS}
           secret_hash as matched_hash, 0 as previous, null as replaced_at
    from api_keys left join key_details on key_details.key_id = api_keys.id
    where secret_hash = ?
    union all
    {_HOLDER_COLUMNS}
           previous_secret_hash, 1, null
    from api_keys left join key_details on key_details.key_id = api_keys.id
    where previous_secret_hash = ? and {{in_grace}}
    union all
    {_HOLDER_COLUMNS}
           replaced.secret_hash, 2, replaced.deleted_at
    from deleted_credentials replaced join api_keys on api_keys.id = replaced.key_id
    left join key_details on key_details.key_id = api_keys.id
    where replaced.secret_hash = ?
"""
_REPORTED = """
    select holders.*, exists (
        select 1 from leak_reports r
        where r.key_id = holders.id and r.secret_hash = holders.matched_hash
    ) as reported
    from ({holders}) holders
    order by reported, seq, previous limit ?
"""
BY_SECRET = Sql(
    _REPORTED.format(holders=_HOLDERS.format(in_grace="julianday(previous_until) > julianday(?)")),
    _REPORTED.format(
        holders=_HOLDERS.format(in_grace="previous_until::timestamptz > ?::text::timestamptz")
    ),
)
MARK_LEAKED = """
    insert into leak_reports (key_id, secret_hash, reported_at) values (?, ?, ?)
    on conflict (key_id, secret_hash) do nothing
"""


async def rows_with_secret(conn: Connection, secret_hash: bytes, now: datetime) -> list[Any]:
    """BY_SECRET's rows for ``secret_hash`` at ``now``."""
    params = (secret_hash, secret_hash, to_text(now), secret_hash, LEAKED_KEYS_READ)
    return await fetch_all(conn, BY_SECRET, params)


async def mark_leaked(conn: Connection, key_id: str, secret_hash: bytes, now: datetime) -> None:
    """Remember that the secret of ``secret_hash`` was reported leaked for the key."""
    await conn.execute(MARK_LEAKED, (key_id, secret_hash, to_text(now)))
