"""Key operations beyond plain SQL: choosing credentials (generated, or the
client's own through ``hashData``), refusing to grant roles the caller does
not hold or to touch a key stronger than the caller, rotating a key's
credentials with a grace period for the old ones, and the signed list cursor.

An update, rotation or delete reads the key, checks these rules and writes inside
one transaction of the store's (``Store.transaction``); a create's rule is checked
before the write and again in its batch's transaction (``_granted_by``). Each
write records its activities (``keysvc.domain.activities``) in its own transaction."""

import functools
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from keysvc.config import ConfigError
from keysvc.credentials import SUFFIX_LENGTH, Hasher, new_key_id, new_secret
from keysvc.db import keys as key_sql
from keysvc.db import meta
from keysvc.db.contract import Connection, Recheck, Store
from keysvc.db.statements import settle, tentatively
from keysvc.domain import activities, cursors, identities, namedlimits
from keysvc.domain import credits as credit_rules
from keysvc.domain.activities import SYSTEM
from keysvc.domain.limits import MAX_ROLE_IDS, OWN_ACCESS
from keysvc.domain.permissions import cannot_grant, missing
from keysvc.errors import BadRequest, Conflict, Forbidden, NotFound, PreconditionFailed
from keysvc.keyview import api_key
from keysvc.models import (
    Activity,
    Actor,
    Key,
    KeyChange,
    KeyPage,
    NewKey,
    Organization,
    Role,
)
from keysvc.timeutil import utcnow

NO_ROLE = "roles: a key needs at least one role: give roles or assignedRoleIds"
TOO_MANY_ROLES = (
    f"assignedRoleIds: a key holds at most {MAX_ROLE_IDS} roles, those named in roles included"
)
NOT_FOUND = "key not found in this organization"
BAD_CURSOR = cursors.BAD_CURSOR
# The CLI's writes, by keysvc itself: actorDetails says which command.
BOOTSTRAP = Actor("system", details="keysvc bootstrap")
ADMIN_KEY = Actor("system", details="keysvc admin-key")


@dataclass(frozen=True)
class Issued:
    """A stored key, and its credentials when keysvc generated them (shown once)."""

    key: Key
    key_id: str | None = None
    secret: str | None = None


async def grantable_roles(
    store: Store, caller: Key | None, organization_id: str, data: dict[str, Any]
) -> list[Role]:
    """The roles that ``data`` names, each of which the caller may grant."""
    ids = [str(role_id) for role_id in data.get("assignedRoleIds") or ()]
    roles = await store.roles.resolve_roles(organization_id, data.get("roles") or (), ids)
    found = {role.id for role in roles}
    unknown = next((role_id for role_id in ids if role_id not in found), None)
    if unknown is not None:
        raise BadRequest(f"assignedRoleIds: no role {unknown} in this organization")
    if not roles:
        raise BadRequest(NO_ROLE)
    if len(roles) > MAX_ROLE_IDS:
        raise BadRequest(TOO_MANY_ROLES)
    refusal = None if caller is None else _grant_refused(caller, roles)
    if refusal is not None:
        raise refusal
    return roles


def _grant_refused(caller: Key, roles: Iterable[Role]) -> Forbidden | None:
    """Why ``caller`` may not grant ``roles``, if it may not: the first role holding a
    permission the caller lacks."""
    for role in roles:
        refusal = cannot_grant(caller.permissions, role.name, role.permissions)
        if refusal is not None:
            return Forbidden(refusal)
    return None


@dataclass(frozen=True)
class NewCredentials:
    """A key's credentials as stored (keyed hashes and suffix), and in plain text when
    keysvc generated them (shown once); a client's own ``hashData`` has none."""

    key_id_hash: bytes = field(repr=False)
    secret_hash: bytes = field(repr=False)
    suffix: str
    key_id: str | None = field(default=None, repr=False)
    secret: str | None = field(default=None, repr=False)


def new_credentials(hasher: Hasher, hash_data: Mapping[str, str] | None) -> NewCredentials:
    """Generated credentials, or the client's own from a validated ``hashData``."""
    if hash_data is not None:
        return NewCredentials(
            hasher.keyed(hash_data["keyIdHash"]),
            hasher.keyed(hash_data["keySecretHash"]),
            hash_data["keyIdSuffix"],
        )
    key_id, secret = new_key_id(), new_secret(hasher.secret_prefix)
    return NewCredentials(
        hasher.of_plain(key_id), hasher.of_plain(secret), key_id[-SUFFIX_LENGTH:], key_id, secret
    )


def _new_key(
    hasher: Hasher, organization_id: str, data: dict[str, Any], roles: list[Role], now: datetime
) -> tuple[NewKey, str | None, str | None]:
    made = new_credentials(hasher, data.get("hashData"))
    new = NewKey(
        organization_id=organization_id,
        name=data["name"],
        state=data.get("state", "enabled"),
        key_id_hash=made.key_id_hash,
        secret_hash=made.secret_hash,
        key_suffix=made.suffix,
        created_at=now,
        expire_at=data.get("expireAt"),
        ip_access_list=data.get("ipAccessList") or [],
        role_ids=[role.id for role in roles],
        rate_limit=_rate_limit(data.get("rateLimit")),
        external_id=data.get("externalId"),
        meta=data.get("meta"),
        credits=credit_rules.credits_of(data.get("credits"), now),
        ratelimits=_stored_limits(data.get("ratelimits")),
    )
    return new, made.key_id, made.secret


def _stored_limits(entries: list[dict[str, Any]] | None) -> str | None:
    """Validated ``ratelimits`` entries in their stored form; null or none: None."""
    return namedlimits.dumps(namedlimits.from_wire(entries)) if entries else None


def _rate_limit(value: dict[str, int] | None) -> tuple[int, int] | None:
    return None if value is None else (value["limit"], value["windowSeconds"])


async def create_key(
    store: Store,
    hasher: Hasher,
    caller: Key,
    organization_id: str,
    data: dict[str, Any],
    now: datetime,
    max_keys: int,
    actor: Actor,
) -> Issued:
    """Store a key from a validated create body. Its roles are checked here, and again
    against the caller's permissions in the create's transaction (``_granted_by``)."""
    roles = await grantable_roles(store, caller, organization_id, data)
    await identities.check_joining(store, caller, organization_id, data.get("externalId"))
    new, key_id, secret = _new_key(hasher, organization_id, data, roles, now)
    announce = activities.announcer(actor, now)
    key = await store.create_key(new, max_keys, announce, _granted_by(caller))
    return Issued(key, key_id, secret)


def _granted_by(caller: Key) -> Recheck:
    """The create's rule, run again in the transaction that writes it, with its roles
    as they are then: they were checked before the write, and another write may have
    widened one since. A role deleted since is not among them: the insert refuses it."""

    def recheck(new: NewKey, roles: Mapping[str, Role]) -> Forbidden | None:
        return _grant_refused(caller, (roles[r] for r in new.role_ids if r in roles))

    return recheck


STRONGER_KEY = "cannot change this key: it holds a permission this key lacks"


def may_change(caller: Key, target: Key) -> None:
    """Refuse unless ``caller`` holds every permission ``target`` holds. A key that may
    update or delete keys would otherwise demote, delete, re-enable or unrestrict keys
    stronger than itself, an admin's included. The answer names no permission: the
    caller may not be allowed to read the key."""
    if missing(caller.permissions, sorted(target.permissions)) is not None:
        raise Forbidden(STRONGER_KEY)


def _own_access(caller: Key, key_id: str, fields: Iterable[str]) -> None:
    """A key may only rename itself."""
    if key_id == caller.id:
        own = next((field for field in OWN_ACCESS if field in fields), None)
        if own is not None:
            raise Forbidden(f"a key cannot change its own {own}: use another key to change it")


async def check_update(
    store: Store, caller: Key, organization_id: str, key_id: str, fields: Iterable[str]
) -> None:
    """The refusals of a PATCH that need no valid body, given the names of the fields it
    sends: run before the body is validated, so that a caller who may not change the key
    is answered before the body is read entry by entry. ``update_key`` checks again."""
    _own_access(caller, key_id, fields)
    may_change(caller, await get_key(store, organization_id, key_id))


def cached_key(store: Store, organization_id: str, key_id: str) -> Key | None:
    """The key as committed now if the store has it cached (``Store.cached_key``: no
    coroutine, no statement, no timer); None otherwise."""
    return store.cached_key(organization_id, key_id)


async def read_key(store: Store, organization_id: str, key_id: str) -> Key:
    """The key as committed now, read (timed) and cached by ``Store.get_key``; or 404."""
    key = await store.get_key(organization_id, key_id)
    if key is None:
        raise NotFound(NOT_FOUND)
    return key


async def get_key(store: Store, organization_id: str, key_id: str) -> Key:
    """The key as committed now, or 404: cached (``cached_key``) or read (``read_key``)."""
    return cached_key(store, organization_id, key_id) or await read_key(
        store, organization_id, key_id
    )


async def update_key(
    store: Store,
    caller: Key,
    organization_id: str,
    key_id: str,
    data: dict[str, Any],
    if_match: Collection[str] | None,
    actor: Actor,
    now: datetime,
) -> Key:
    """Apply a validated PATCH body; roles and ipAccessList replace. The target must be
    no stronger than the caller (``may_change``), and a key may only rename itself."""
    _own_access(caller, key_id, data)
    joining = data.get("externalId")
    if joining is not None:
        current = await get_key(store, organization_id, key_id)
        if joining != current.external_id:
            await identities.check_joining(store, caller, organization_id, joining)
    role_ids = None
    if "roles" in data or "assignedRoleIds" in data:
        role_ids = [r.id for r in await grantable_roles(store, caller, organization_id, data)]
    change = KeyChange(
        name=data.get("name"),
        state=data.get("state"),
        expire_at=data.get("expireAt"),
        clear_expiry="expireAt" in data and data["expireAt"] is None,
        ip_access_list=data.get("ipAccessList"),
        role_ids=role_ids,
        rate_limit=_rate_limit(data.get("rateLimit")),
        clear_rate_limit="rateLimit" in data and data["rateLimit"] is None,
        external_id=data.get("externalId"),
        clear_external_id="externalId" in data and data["externalId"] is None,
        meta=data.get("meta"),
        clear_meta="meta" in data and data["meta"] is None,
        credits=credit_rules.credits_of(data.get("credits"), now),
        set_credits="credits" in data,
        ratelimits=_stored_limits(data.get("ratelimits")),
        set_ratelimits="ratelimits" in data,
    )
    key = await change_key(
        store,
        organization_id,
        key_id,
        change,
        if_match,
        lambda target: may_change(caller, target),
        actor,
        now,
    )
    if key is None:
        raise NotFound(NOT_FOUND)
    return key


async def change_key(
    store: Store,
    organization_id: str,
    key_id: str,
    change: KeyChange,
    if_match: Collection[str] | None = None,
    check: Callable[[Key], None] | None = None,
    actor: Actor = SYSTEM,
    now: datetime | None = None,
) -> Key | None:
    """Apply ``change`` in one transaction; None if there is no such key. With
    ``if_match``, only if the key's ETag is among them. ``check`` sees the key there as
    it is, then as changed (so roles widened by another write since they were checked
    are caught), and may refuse by raising: the transaction is then rolled back. Each
    kind of change is recorded as ``actor``'s activity at ``now`` (default: the time
    of the change), and the ``key.updated`` event is sent, in the same transaction. A
    change to nothing writes nothing, records nothing and sends nothing."""
    async with store.transaction("update_key") as conn:
        current = await _checked(conn, organization_id, key_id, check, if_match)
        if current is None:
            return None
        await tentatively(conn)
        await key_sql.update_key(conn, current, change)
        changed = await key_sql.get_key(conn, organization_id, key_id)
        if changed is None:
            return None
        if check is not None:
            check(changed)
        at = now or utcnow()
        logged = activities.key_changed(current, changed, actor, at)
        await settle(conn, keep=bool(logged))
        # Issue 36: a key given an externalId belongs to its identity, made if missing.
        await key_sql.ensure_identity(conn, organization_id, change.external_id, at)
        if not logged:
            return current
        await store.authorization_changed(conn)
        await announce_change(store, conn, changed, logged, at)
        return changed


async def announce_change(
    store: Store, conn: Connection, key: Key, logged: list[Activity], at: datetime
) -> None:
    """Inside the write's transaction: record a change to ``key`` (now as given) and
    send its ``key.updated`` event; nothing when ``logged`` is empty (nothing changed).
    A change that disables the key is a revocation: never refused for a quota, whatever
    else it changes (``activities.revokes``)."""
    if not logged:
        return
    revoking = activities.revokes(logged)
    for activity in logged:
        await store.record(conn, activity, revoking)
    await store.enqueue(
        conn, key.organization_id, "key.updated", api_key(key), at, revoking=revoking
    )


async def delete_key(
    store: Store,
    caller: Key,
    organization_id: str,
    key_id: str,
    if_match: Collection[str] | None,
    actor: Actor,
    now: datetime,
) -> None:
    """Delete another key of the organization, no stronger than the caller; with
    ``if_match``, only if the key's ETag is among them."""
    if key_id == caller.id:
        raise BadRequest("a key cannot delete itself: use another key to delete it")
    check = functools.partial(may_change, caller)
    if not await remove_key(store, organization_id, key_id, check, if_match, actor, now):
        raise NotFound(NOT_FOUND)


async def remove_key(
    store: Store,
    organization_id: str,
    key_id: str,
    check: Callable[[Key], None] | None = None,
    if_match: Collection[str] | None = None,
    actor: Actor = SYSTEM,
    now: datetime | None = None,
) -> bool:
    """Delete the key in one transaction; False if there is none. ``check`` and
    ``if_match`` as for ``change_key``: both are decided in that transaction, which
    records the delete as ``actor``'s activity at ``now`` and sends the ``key.deleted``
    event, both with the key as it was."""
    async with store.transaction("delete_key") as conn:
        current = await _checked(conn, organization_id, key_id, check, if_match)
        if current is None or not await key_sql.delete_key(conn, organization_id, key_id):
            return False
        await store.authorization_changed(conn)
        at = now or utcnow()
        # A revocation: never refused for a quota (keysvc.db.quota).
        await store.record(conn, activities.key_deleted(current, actor, at), revoking=True)
        await store.enqueue(
            conn, organization_id, "key.deleted", api_key(current), at, revoking=True
        )
    return True


ROTATED_BY_PREVIOUS = (
    "a key cannot rotate itself with its previous credentials: use its current key ID"
    " and secret, or another key"
)
DISABLED = "the key is disabled: enable it (PATCH state enabled) before rotating it"
EXPIRED = "the key has expired: extend its expireAt (PATCH) before rotating it, or create a new key"
# Rotating another key hands its new credentials to the caller, so it asks for the
# power to mint credentials: keys:update alone would let a key whose own expiry, IP
# access list or rate limit it may not lift obtain credentials carrying none of them.
ROTATE_OTHER = "keys:create"
ROTATE_OTHER_REFUSED = (
    f"rotating another key also needs the permission {ROTATE_OTHER}, which this key lacks:"
    " rotate it with a key that holds it (a key may rotate itself with keys:update)"
)


async def rotate_key(
    store: Store,
    hasher: Hasher,
    caller: Key,
    by_previous: bool,
    organization_id: str,
    key_id: str,
    data: dict[str, Any],
    actor: Actor,
    now: datetime,
) -> Issued:
    """Give a key new credentials, from a validated rotate body; its name, roles, IP
    access list, limits and expiry stay. The replaced ones keep working for the body's
    grace period, never past the key's expiry, and any that an earlier rotation kept
    stop at once. Read, checked and written in one transaction, with ``actor``'s
    activity and the ``key.rotated`` event.

    The key must be no stronger than the caller (``may_change``). A key may rotate
    itself (it gains no access by it), but not with the previous credentials it
    authenticated with (``by_previous``): their holder would get new ones that outlive
    the grace period that was meant to end them. Rotating another key also needs
    ``keys:create`` (``ROTATE_OTHER``): its new credentials reach the caller.
    """
    made = new_credentials(hasher, data.get("hashData"))
    grace = timedelta(seconds=data["gracePeriodSeconds"])
    async with store.transaction("rotate_key") as conn:
        if key_id != caller.id and missing(caller.permissions, (ROTATE_OTHER,)) is not None:
            raise Forbidden(ROTATE_OTHER_REFUSED)
        current = await key_sql.get_key(conn, organization_id, key_id)
        if current is None:
            raise NotFound(NOT_FOUND)
        may_change(caller, current)
        if key_id == caller.id and by_previous:
            raise Forbidden(ROTATED_BY_PREVIOUS)
        if current.state != "enabled":
            raise Conflict(DISABLED)
        if current.expire_at is not None and current.expire_at <= now:
            raise Conflict(EXPIRED)
        if await key_sql.key_id_in_use(conn, made.key_id_hash):
            raise Conflict(key_sql.KEY_ID_TAKEN)
        until = None
        if grace:
            until = now + grace
            if current.expire_at is not None:
                until = min(until, current.expire_at)
        await key_sql.rotate_key(
            conn, key_id, made.key_id_hash, made.secret_hash, made.suffix, until, now
        )
        await store.authorization_changed(conn)
        rotated = await key_sql.get_key(conn, organization_id, key_id)
        assert rotated is not None
        await store.record(conn, activities.key_rotated(current, rotated, actor, now))
        await store.enqueue(conn, organization_id, "key.rotated", api_key(rotated), now)
    return Issued(rotated, made.key_id, made.secret)


async def _checked(
    conn: Connection,
    organization_id: str,
    key_id: str,
    check: Callable[[Key], None] | None,
    if_match: Collection[str] | None,
) -> Key | None:
    """The key as it is inside the transaction, once ``check`` and ``if_match`` have let
    it pass; None if there is no such key."""
    current = await key_sql.get_key(conn, organization_id, key_id)
    if current is not None:
        if check is not None:
            check(current)
        _check_if_match(current, if_match)
    return current


def _check_if_match(key: Key, if_match: Collection[str] | None) -> None:
    """Refuse (412) unless If-Match is absent, ``*`` (any existing key: RFC 9110,
    section 13.1.1) or names the key's current ETag."""
    if if_match is not None and "*" not in if_match and key.etag not in if_match:
        raise PreconditionFailed()


async def _new_admin_key(
    store: Store, hasher: Hasher, organization_id: str, name: str, now: datetime
) -> tuple[NewKey, str | None, str | None]:
    """An ``admin`` key with generated credentials, granted by no caller."""
    data = {"name": name, "roles": ["admin"]}
    roles = await grantable_roles(store, None, organization_id, data)
    return _new_key(hasher, organization_id, data, roles, now)


async def bootstrap(
    store: Store, hasher: Hasher, org_name: str, now: datetime
) -> tuple[Organization, Issued]:
    """A new organization with a first ``admin`` key, in one transaction with the
    key's activity, whose actor is keysvc itself: the stand-in for a console."""
    new, key_id, secret = await _new_admin_key(store, hasher, "", f"{org_name} admin", now)
    org = Organization(id=str(uuid.uuid4()), name=org_name, created_at=now)
    async with store.transaction("bootstrap") as conn:
        await meta.insert_organization(conn, org)
        key = await key_sql.insert_key(conn, replace(new, organization_id=org.id))
        await store.record(conn, activities.key_created(key, BOOTSTRAP, now))
    return org, Issued(key, key_id, secret)


async def admin_key(
    store: Store,
    hasher: Hasher,
    organization_id: str | None,
    name: str,
    now: datetime,
    max_keys: int,
) -> Issued:
    """A new ``admin`` key for an existing organization, for an operator with the
    database at hand (``keysvc admin-key``), as when the only admin secret is lost.

    ``organization_id`` may be left out when the database holds one organization.
    ``name`` is a valid key name (the create schema's rules); stored like any created
    key, in one transaction, within the key limit.
    """
    known = await store.organization_ids()
    if organization_id is None:
        if not known:
            raise ConfigError("the database has no organization yet: run `keysvc bootstrap`")
        if len(known) > 1:
            raise ConfigError(
                f"the database holds several organizations; pick one with --org: {' '.join(known)}"
            )
        organization_id = known[0]
    elif organization_id not in known:
        raise ConfigError(f"org: no organization {organization_id[:64]!r} in this database")
    new, key_id, secret = await _new_admin_key(store, hasher, organization_id, name, now)
    key = await store.create_key(new, max_keys, activities.announcer(ADMIN_KEY, now))
    return Issued(key, key_id, secret)


async def list_keys(
    store: Store, organization_id: str, after: int, limit: int, external_id: str | None = None
) -> KeyPage:
    """Up to ``limit`` keys, oldest first, after the place ``after`` (``decode_cursor``);
    only those of ``external_id`` when given."""
    return await store.list_keys(organization_id, after, limit, external_id)


# What a cursor's MAC is made for. Cursors that carried the global row sequence were
# signed for "cursor": those are refused now, rather than read as a place.
_CURSOR = "cursor position"


def encode_cursor(hasher: Hasher, organization_id: str, key: Key) -> str:
    """An opaque cursor after ``key``, valid only for this organization's list. It
    carries the key's place in its organization (``Key.org_seq``), which moves only
    with this organization's own creates: nothing of other organizations shows."""
    return cursors.encode(hasher, _CURSOR, organization_id, key.org_seq)


def decode_cursor(hasher: Hasher, organization_id: str, cursor: str | None) -> int:
    """The place a cursor stands for; 0 for none. A forged or foreign cursor is a 400."""
    return cursors.decode(hasher, _CURSOR, organization_id, cursor)


def next_cursor(hasher: Hasher, organization_id: str, page: KeyPage) -> str | None:
    return encode_cursor(hasher, organization_id, page.keys[-1]) if page.more else None
