"""Keys brought in from another service (issue 37): a batch of validated records, each
with the caller's own ID for it (``importId``) and its material as a hash, stored in
one transaction; and the organization's keys read out again for an export.

The rules, in order:
- each record is checked as a create is (``keysvc.http.import_schemas`` for its fields;
  here its roles, which the caller must be allowed to grant, now and again in the
  transaction), and a refused record is reported by its index with the reason, while
  the others go in;
- a record whose importId the organization has imported before is skipped, quietly:
  importing the same file twice makes each key once (the importIds stay after their
  keys are deleted, so a repeated import never brings a deleted key back);
- a record whose material another key answers to is refused, as a create's taken key
  ID is; so is one that repeats an importId or material of its own batch;
- the organization's key limit counts the batch, record by record: those past it are
  refused;
- the batch is one transaction, with one activity (``key_import``) that holds its count
  and each key's recorded values, so that ``keysvc audit verify`` replays them as it
  replays creates. No key.created event is sent: an import is not a new key's birth.

Material: ``hashData`` (a key ID and secret pair, as a create takes it), a token hash
(the SHA-256 of a bearer token, ``keysvc.credentials.Hasher.token_lookup``), or none:
an exported record carries no material, and imports as a key that no credentials open
until its owner rotates it (``POST .../rotate``), as docs/SECURITY.md says.
"""

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from keysvc.credentials import Hasher, sha256_b64
from keysvc.db import imports as import_sql
from keysvc.db import keys as key_sql
from keysvc.db.activities import json_text
from keysvc.db.contract import Store
from keysvc.domain import credits as credit_rules
from keysvc.domain import identities, namedlimits
from keysvc.domain import keys as key_rules
from keysvc.domain.activities import KEY_IMPORT, key_values
from keysvc.domain.permissions import cannot_grant
from keysvc.errors import ApiError, DatabaseUnavailable
from keysvc.keyview import api_key
from keysvc.models import Activity, Actor, JsonText, Key, NewKey, Role
from keysvc.timeutil import to_text, utcnow

# The most records one import request holds (a batch of the CLI's may hold more:
# keysvc.cli.porting.MAX_BATCH).
MAX_IMPORT_RECORDS = 1000
TOKEN_TAKEN = "tokenHash: a key with this token already exists"  # noqa: S105 - a message
REPEATED_IMPORT_ID = "importId: an earlier record of this batch has the same importId"
REPEATED_MATERIAL = "an earlier record of this batch has the same key ID or token"
# The CLI's imports, by keysvc itself.
CLI_ACTOR = Actor("system", details="keysvc import")


@dataclass(frozen=True)
class ImportResult:
    """What a batch did: each imported record's (index, importId, key UUID); the indexes
    skipped as imported before; each refused record's (index, importId, reason)."""

    imported: list[tuple[int, str, str]] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    errors: list[tuple[int, str, str]] = field(default_factory=list)


class _Planned(NamedTuple):
    """A record that may go in, made into its rows but the place of its key in the
    organization (``key_row``'s second value, 0 until the transaction gives it). Plain
    values, a tuple: ``keysvc import`` sends a million of them from the process that
    plans them to the one that writes them (``keysvc.cli.importworker``)."""

    position: int  # the record's index in its request, or its line in the CLI's file
    import_id: str
    key_id: str
    key_id_hash: bytes
    token: bool
    role_ids: tuple[str, ...]
    external_id: str | None
    key_row: tuple[object, ...]
    detail_row: tuple[object, ...] | None
    import_row: tuple[str, str, str, str]
    # What the batch's activity keeps of the key, encoded (``_view``).
    view: str


def material(hasher: Hasher, data: Mapping[str, Any]) -> tuple[bytes, bytes, str, bool]:
    """A record's (key-ID hash, secret hash, suffix, is a token) from its validated
    material: hashData as a create stores it, a token hash (base64 of its SHA-256, as
    the schema leaves it) under its lookup hash, or none: random hashes of values no one
    holds, so that the key opens with nothing until it is rotated."""
    token = data.get("tokenHash")
    if token is not None:
        digest = token["value"]
        return hasher.token_lookup(digest), hasher.keyed(digest), "", True
    if data.get("hashData") is not None:
        made = key_rules.new_credentials(hasher, data["hashData"])
        return made.key_id_hash, made.secret_hash, made.suffix, False
    unknown = sha256_b64(secrets.token_hex(32))
    return hasher.keyed(unknown), hasher.keyed(sha256_b64(secrets.token_hex(32))), "", False


# How long an import waits for its organization's imports before it (each bounded by
# the store's own write deadline): past it, a 503 with Retry-After, never a hang.
IMPORT_WAIT_SECONDS = 30.0
IMPORT_WAITED = "database busy: this organization's earlier imports are still being written"


class ImportTurns:
    """One import of an organization at a time waits for the writer: a tenant's
    concurrent imports queue here, not at the writer, where every other organization's
    writes (revocations included) would wait behind each of them in turn. One per app
    (``keysvc.http.app.create_app``) or ``keysvc import`` run: never shared by two apps
    in one process, whose stores are their own."""

    def __init__(self) -> None:
        # The organizations with an import waiting for or holding the writer: each a
        # lock and how many imports hold or wait for it.
        self._waiting: dict[str, tuple[asyncio.Lock, int]] = {}
        # While imports of an organization wait: when (time.monotonic) and why the last
        # of its turns ended with the database unavailable.
        self._refused: dict[str, tuple[float, str]] = {}

    def __len__(self) -> int:
        """How many organizations have an import waiting or being written."""
        return len(self._waiting)

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, organization_id: str) -> AsyncIterator[None]:
        """The organization's turn. An import that waited while a turn ended with the
        database unavailable (locked by another process past the busy timeout, stopped)
        is refused with it, at once, rather than wait as long again: the Nth of
        concurrent imports was refused after N busy timeouts (rt54 S2)."""
        arrived = time.monotonic()
        lock, users = self._waiting.get(organization_id, (asyncio.Lock(), 0))
        self._waiting[organization_id] = (lock, users + 1)
        try:
            try:
                async with asyncio.timeout(IMPORT_WAIT_SECONDS):
                    await lock.acquire()
            except TimeoutError:
                raise DatabaseUnavailable(IMPORT_WAITED) from None
            try:
                refused = self._refused.get(organization_id)
                if refused is not None and refused[0] > arrived:
                    raise DatabaseUnavailable(refused[1])
                try:
                    yield
                except DatabaseUnavailable as unavailable:
                    self._refused[organization_id] = (time.monotonic(), unavailable.message)
                    raise
            finally:
                lock.release()
        finally:
            lock, users = self._waiting[organization_id]
            if users == 1:
                del self._waiting[organization_id]
                self._refused.pop(organization_id, None)
            else:
                self._waiting[organization_id] = (lock, users - 1)


@dataclass(frozen=True)
class PlannedBatch:
    """A batch's records checked and made into rows outside any transaction
    (``plan_batch``): what ``write_batch`` still decides is which of them go in."""

    organization_id: str
    caller: Key | None
    now: datetime
    planned: list[_Planned]
    result: ImportResult


async def import_batch(
    store: Store,
    hasher: Hasher,
    caller: Key | None,
    organization_id: str,
    records: Sequence[tuple[int, Mapping[str, Any]]],
    now: datetime,
    max_keys: int,
    actor: Actor,
    turns: ImportTurns,
    clock: Callable[[], datetime] = utcnow,
) -> ImportResult:
    """Store ``records`` (each (index, validated record)) in one transaction, by the
    rules above. ``caller``: the key whose grants bound the records' roles; None for the
    operator's CLI, which may grant any role of the organization. ``turns``: the app's
    (or the CLI run's) queue of each organization's imports. ``clock``: the time the
    batch's activity is recorded at (``write_batch``)."""
    batch = await plan_batch(store, hasher, caller, organization_id, records, now)
    return await write_batch(store, batch, max_keys, actor, turns, clock)


async def plan_batch(
    store: Store,
    hasher: Hasher,
    caller: Key | None,
    organization_id: str,
    records: Sequence[tuple[int, Mapping[str, Any]]],
    now: datetime,
) -> PlannedBatch:
    """``import_batch``'s first half, which writes nothing: each record's roles and
    material checked, its key's UUID, rows and activity view made. ``keysvc import``
    plans its batches in a second process while it writes (``keysvc.cli.importworker``)."""
    result = ImportResult()
    planned = await _plan(store, hasher, caller, organization_id, records, now, result)
    return PlannedBatch(organization_id, caller, now, planned, result)


async def write_batch(
    store: Store,
    batch: PlannedBatch,
    max_keys: int,
    actor: Actor,
    turns: ImportTurns,
    clock: Callable[[], datetime] = utcnow,
) -> ImportResult:
    """``import_batch``'s second half: the planned records that may go in, as things
    are inside the transaction, written in it. Its activity is recorded at ``clock()``
    then, not at the batch's planning: the CLI plans ahead, and an import may wait for
    its turn, while other writes of the organization are recorded (rt60 F7)."""
    # A request's batch (a caller's) looks its key IDs up first; the operator's own
    # import, whose batches are 10 times larger, first writes without (see _write).
    if batch.caller is not None:
        return await _write(store, batch, max_keys, actor, turns, clock, careful=True)
    try:
        return await _write(store, batch, max_keys, actor, turns, clock, careful=False)
    except import_sql.KeyIdTaken:
        # That transaction rolled back, nothing of it written: again, each key ID looked
        # up first, so that the one taken is refused and the rest go in.
        return await _write(store, batch, max_keys, actor, turns, clock, careful=True)


async def _write(
    store: Store,
    batch: PlannedBatch,
    max_keys: int,
    actor: Actor,
    turns: ImportTurns,
    clock: Callable[[], datetime],
    careful: bool,
) -> ImportResult:
    """``write_batch`` in one transaction. ``careful``: each record's key ID looked up
    first in both of a key's indexes (current and previous key IDs), and one taken
    refused. Not ``careful``: only the previous key IDs, which no index refuses, and a
    current one taken is refused by its unique index at insert (``KeyIdTaken``); the
    lookup was a tenth of SQLite's time in a 1,000,000-key ``keysvc import``. Not for
    a request's batch: a taken key ID would have the writer do its inserts twice
    (once rolled back, uncharged to the write budget)."""
    organization_id, caller, planned = batch.organization_id, batch.caller, batch.planned
    planning = batch.result  # the refusals of the planning, copied: a batch may be written twice
    result = ImportResult(list(planning.imported), list(planning.skipped), list(planning.errors))
    async with turns.one_at_a_time(organization_id), store.transaction("import_keys") as conn:
        taken_ids = await import_sql.taken_import_ids(
            conn, organization_id, [p.import_id for p in planned]
        )
        fresh = [p for p in planned if p.import_id not in taken_ids]
        result.skipped.extend(p.position for p in planned if p.import_id in taken_ids)
        lookup = import_sql.taken_key_id_hashes if careful else import_sql.taken_previous_hashes
        taken = await lookup(conn, [p.key_id_hash for p in fresh])
        role_ids = list(dict.fromkeys(r for p in fresh for r in p.role_ids))
        granted = await import_sql.roles_now(conn, role_ids)
        count, last = await import_sql.counts(conn, organization_id)
        rows: tuple[list[Any], list[Any], list[Any], list[Any]] = ([], [], [], [])
        views = []
        owners: dict[str, None] = {}  # the imported keys' externalIds, each once
        for item in fresh:
            refusal = _refusal(item, taken, granted, caller, count, max_keys)
            if refusal is not None:
                result.errors.append((item.position, item.import_id, refusal))
                continue
            count, last = count + 1, last + 1
            _rows_of(rows, last, item)
            if item.external_id is not None:
                owners[item.external_id] = None
            views.append(item.view)
            result.imported.append((item.position, item.import_id, item.key_id))
        if views:
            after = _after(views)
            # Recorded first: its charge is what refuses a batch past the write budget
            # (429), and refused before its rows go in, the batch holds the one write
            # lock for a few reads, not for a thousand keys' inserts and their rollback.
            # The operator's own import is counted in the budget, never refused by it.
            await store.record(
                conn,
                Activity(organization_id, KEY_IMPORT, actor, clock(), after=after),
                revoking=caller is None,
            )
            await import_sql.widen_cache(conn)
            if caller is None:  # the operator's own process: see LONG_WAL
                await import_sql.lengthen_wal(conn)
            await import_sql.insert_batch(conn, organization_id, last, *rows)
            # Issue 36: each externalId's identity, made if missing, as a create makes it.
            for external_id in owners:
                await key_sql.ensure_identity(conn, organization_id, external_id, batch.now)
            if caller is not None:  # a server's connection: its cache as it was
                await import_sql.narrow_cache(conn)
    result.errors.sort()
    return result


async def _plan(
    store: Store,
    hasher: Hasher,
    caller: Key | None,
    organization_id: str,
    records: Sequence[tuple[int, Mapping[str, Any]]],
    now: datetime,
    result: ImportResult,
) -> list[_Planned]:
    """Each record's roles (checked as a create checks them, asked once per distinct
    choice), material, key UUID, rows and view; the refused go to ``result.errors``.
    """
    # Each choice's roles and their IDs (without repeats), or why it is refused.
    chosen: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[list[Role], list[str]] | ApiError]
    chosen = {}
    seen_ids: set[str] = set()
    seen_material: set[bytes] = set()
    joins: dict[str, str | None] = {}
    planned = []
    stamp = to_text(now)
    for index, data in records:
        import_id = data["importId"]
        legacy, assigned = data.get("roles"), data.get("assignedRoleIds")
        choice = (
            tuple(legacy) if legacy else (),
            tuple(map(str, assigned)) if assigned else (),
        )
        if choice not in chosen:
            try:
                grantable = await key_rules.grantable_roles(
                    store, caller, organization_id, dict(data)
                )
                chosen[choice] = (grantable, list(dict.fromkeys(r.id for r in grantable)))
            except ApiError as exc:
                chosen[choice] = exc
        roles_chosen = chosen[choice]
        if isinstance(roles_chosen, ApiError):
            result.errors.append((index, import_id, roles_chosen.message))
            continue
        roles, role_ids = roles_chosen
        joining = data.get("externalId")
        if joining is not None:
            refused = await _join_refusal(store, caller, organization_id, joining, joins)
            if refused is not None:
                result.errors.append((index, import_id, refused))
                continue
        key_id_hash, secret_hash, suffix, token = material(hasher, data)
        if import_id in seen_ids or key_id_hash in seen_material:
            reason = REPEATED_IMPORT_ID if import_id in seen_ids else REPEATED_MATERIAL
            result.errors.append((index, import_id, reason))
            continue
        seen_ids.add(import_id)
        seen_material.add(key_id_hash)
        new = NewKey(
            organization_id=organization_id,
            name=data["name"],
            state=data.get("state", "enabled"),
            key_id_hash=key_id_hash,
            secret_hash=secret_hash,
            key_suffix=suffix,
            created_at=now,
            expire_at=data.get("expireAt"),
            ip_access_list=data.get("ipAccessList") or [],
            role_ids=role_ids,
            rate_limit=None
            if data.get("rateLimit") is None
            else (data["rateLimit"]["limit"], data["rateLimit"]["windowSeconds"]),
            external_id=data.get("externalId"),
            meta=data.get("meta"),
            credits=credit_rules.credits_of(data.get("credits"), now),
            # Issue 36's named limits, stored as a create stores them.
            ratelimits=namedlimits.dumps(namedlimits.from_wire(data["ratelimits"]))
            if data.get("ratelimits")
            else None,
        )
        planned.append(_planned(index, import_id, new, roles, token, stamp))
    return planned


async def _join_refusal(
    store: Store,
    caller: Key | None,
    organization_id: str,
    external_id: str | None,
    seen: dict[str, str | None],
) -> str | None:
    """Why a record may not join the identity of ``external_id``
    (``keysvc.domain.identities.check_joining``), asked once per externalId (``seen``)."""
    if external_id is None:
        return None
    if external_id not in seen:
        try:
            await identities.check_joining(store, caller, organization_id, external_id)
            seen[external_id] = None
        except ApiError as exc:
            seen[external_id] = exc.message
    return seen[external_id]


def _refusal(
    item: _Planned,
    taken: set[bytes],
    granted: Mapping[str, Role],
    caller: Key | None,
    count: int,
    max_keys: int,
) -> str | None:
    """Why ``item`` may not go in, as things are inside the transaction; None if it may."""
    if item.key_id_hash in taken:
        return TOKEN_TAKEN if item.token else key_sql.KEY_ID_TAKEN
    if any(role_id not in granted for role_id in item.role_ids):
        return key_sql.ROLE_GONE
    if caller is not None:
        for role_id in item.role_ids:
            role = granted[role_id]
            refusal = cannot_grant(caller.permissions, role.name, role.permissions)
            if refusal is not None:
                return refusal
    if count >= max_keys:
        return key_sql.over_limit(max_keys).message
    return None


_last_uuid = [0, 0]  # the last (milliseconds, sequence) given, in this process
# Random bytes for the UUIDs, from the system's CSPRNG a few KiB at a time (one
# ``os.urandom`` call a key cost more than the rest of its UUID), and where the next
# eight are.
_ENTROPY_BYTES = 8 * 1024
_entropy: list[Any] = [b"", 0]


def _random62() -> int:
    """62 random bits, from ``_entropy``'s pool, made again when spent."""
    pool, at = _entropy
    if at >= len(pool):
        pool, at = secrets.token_bytes(_ENTROPY_BYTES), 0
    _entropy[0], _entropy[1] = pool, at + 8
    return int.from_bytes(pool[at : at + 8], "big") >> 2


def _time_ordered_uuid() -> str:
    """A UUIDv7 (RFC 9562): 48 bits of milliseconds, a 12-bit sequence within the
    millisecond, 62 random bits. An imported batch's keys then go at the end of the
    indexes keyed by key UUID (api_keys.id, key_roles and its role index) rather than
    all over them, which is most of what a large import writes. The time it shows is
    the key's createdAt, which its readers see anyway; 62 random bits keep it
    unguessable, and no key UUID is a credential."""
    millis = time.time_ns() // 1_000_000
    last_millis, sequence = _last_uuid
    if millis <= last_millis:
        millis, sequence = last_millis, sequence + 1
        if sequence > 0xFFF:
            millis, sequence = millis + 1, 0
    else:
        sequence = 0
    _last_uuid[:] = [millis, sequence]
    value = (millis << 80) | (0x7 << 76) | (sequence << 64) | (0b10 << 62) | _random62()
    # str(uuid.UUID(int=value)), without the object: a million keys' worth.
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _planned(
    index: int, import_id: str, new: NewKey, roles: list[Role], token: bool, stamp: str
) -> _Planned:
    """A record that may go in, with its key's UUID, rows and view."""
    key_id = _time_ordered_uuid()
    detail = key_sql.details_row(key_id, new.external_id, new.meta, new.credits, new.ratelimits)
    return _Planned(
        index,
        import_id,
        key_id,
        new.key_id_hash,
        token,
        tuple(new.role_ids),
        new.external_id,
        key_sql.key_row(key_id, 0, new),
        detail,
        (new.organization_id, import_id, key_id, stamp),
        _view(key_id, new, roles),
    )


def _rows_of(
    rows: tuple[list[Any], list[Any], list[Any], list[Any]], org_seq: int, item: _Planned
) -> None:
    keys, roles, details, imports = rows
    row = item.key_row
    keys.append((row[0], org_seq, *row[2:]))
    roles.extend([(item.key_id, role_id) for role_id in item.role_ids])  # no repeats: _plan
    if item.detail_row is not None:
        details.append(item.detail_row)
    imports.append(item.import_row)


def _view(key_id: str, new: NewKey, roles: list[Role]) -> str:
    """What the batch's activity keeps of a key, encoded: the values a create's
    records, which the audit's replay compares (``keysvc.db.replay``)."""
    values = key_values(
        new.name, new.state, new.expire_at, new.ip_access_list, roles, new.rate_limit
    )
    return json_text({"id": key_id, **values})


def _after(views: list[str]) -> JsonText:
    """A batch's activity value, ``{"count": ..., "keys": [...]}`` with each key's
    encoded view, as ``json_text`` encodes the whole (sorted keys, its separators)."""
    return JsonText(f'{{"count": {len(views)}, "keys": [{", ".join(views)}]}}')


def exported(key: Key) -> dict[str, Any]:
    """A key as an export writes it: its public fields, as an import record takes them
    (never a hash or a secret, so no material). Its UUID is the record's importId, so
    that exporting and importing again makes nothing twice."""
    view = api_key(key)
    record: dict[str, Any] = {"importId": key.id, "name": key.name, "state": key.state}
    system = [role.name for role in key.roles if role.type == "system"]
    custom = [role.id for role in key.roles if role.type != "system"]
    if system:
        record["roles"] = system
    if custom:
        record["assignedRoleIds"] = custom
    if view["expireAt"] is not None:
        record["expireAt"] = view["expireAt"]
    if view["ipAccessList"]:
        record["ipAccessList"] = view["ipAccessList"]
    for name in ("rateLimit", "externalId", "meta", "ratelimits"):
        if name in view:
            record[name] = view[name]
    if key.credits is not None:
        refill = key.credits.refill
        plan: dict[str, Any] | None = None
        if refill is not None:
            plan = {"interval": refill.interval, "amount": refill.amount}
            if refill.interval == "monthly":
                plan["refillDay"] = refill.day
        record["credits"] = {"remaining": key.credits.remaining, "refill": plan}
    return record
