"""Identities (issue 36): who several keys are for, by an ``externalId`` unique in its
organization, whose keys share its credits and named limits.

A key belongs to the identity of its organization whose externalId is the key's. Each
write reads, checks and writes in one transaction of the store's, with its activity
(``identity_create``, ``identity_update``, ``identity_delete``: keysvc additions,
listed with ``include=keysvc``). The escalation rule is the keys' one: a caller may
change or delete an identity only if it holds every permission any of the identity's
keys holds (changing the identity changes what those keys may spend), and a key may
not change the credits or limits of its own identity. Creating an identity for an
externalId that keys already carry is such a change too (it gives those keys what to
share), and so is putting a key into an identity that shares credits or limits (the key
then spends them: ``check_joining``, for a key's create, PATCH and import).
"""

import uuid
from collections.abc import Collection, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from keysvc.credentials import Hasher
from keysvc.db import identities as identity_sql
from keysvc.db import roles as role_sql
from keysvc.db.contract import Connection, Store
from keysvc.domain import activities, cursors
from keysvc.domain import credits as credit_rules
from keysvc.domain.namedlimits import dumps, from_wire, loads, to_wire
from keysvc.domain.permissions import has_permission, missing
from keysvc.errors import Conflict, Forbidden, NotFound, PreconditionFailed
from keysvc.keyview import credits_json
from keysvc.models import Activity, Actor, Identity, IdentityPage, Key
from keysvc.timeutil import to_text

NOT_FOUND = "identity not found in this organization"
TAKEN = "externalId: this organization has an identity with this externalId already"
STRONGER = "cannot change this identity: one of its keys holds a permission this key lacks"
JOINING = (
    "externalId: this organization's identity with this externalId shares credits or rate"
    " limits; putting a key into it needs identities:write and every permission its keys hold"
)
OWN = "a key cannot change the credits or limits of its own identity: use another key"
UNLIMITED = (
    'the identity\'s credits are unlimited: set a number first ({"set": n}), then increment'
    " or decrement it"
)
# What a key may not change of its own identity.
_SHARED = ("credits", "ratelimits")
_CURSOR = "identity cursor"


def identity_view(identity: Identity) -> dict[str, Any]:
    """The Identity object of the API document (its activities' and events' data too)."""
    return {
        "id": identity.id,
        "externalId": identity.external_id,
        "meta": identity.meta,
        "credits": credits_json(identity.credits),
        "ratelimits": to_wire(loads(identity.ratelimits)),
        "createdAt": to_text(identity.created_at),
        "updatedAt": to_text(identity.updated_at),
    }


def as_of(identity: Identity, now: datetime) -> Identity:
    """The identity as answered at ``now``: a refill due shown applied (the next spend or
    change writes it)."""
    credits = identity.credits
    if credits is None:
        return identity
    return replace(identity, credits=credit_rules.settled(credits, now))


def _limits(entries: Any) -> str | None:
    """The stored form of loaded ``ratelimits`` entries; None for none."""
    return dumps(from_wire(entries)) if entries else None


def _activity(
    kind: str,
    identity: Identity,
    actor: Actor,
    now: datetime,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
) -> Activity:
    return Activity(identity.organization_id, kind, actor, now, before=before, after=after)


def _changed(before: Identity, after: Identity, actor: Actor, now: datetime) -> Activity | None:
    """The update's activity, with the fields that changed (and the identity's ID and
    externalId); None when none did."""
    old, new = identity_view(before), identity_view(after)
    fields = [f for f in ("meta", "credits", "ratelimits") if old[f] != new[f]]
    if not fields:
        return None
    which = {"identityId": after.id, "externalId": after.external_id}
    return _activity(
        activities.IDENTITY_UPDATE, after, actor, now,
        {**which, **{f: old[f] for f in fields}}, {**which, **{f: new[f] for f in fields}},
    )  # fmt: skip


def _whole(identity: Identity) -> dict[str, Any]:
    view = identity_view(identity)
    return {"identityId": view.pop("id"), **view}


async def create_identity(
    store: Store,
    caller: Key,
    organization_id: str,
    data: Mapping[str, Any],
    now: datetime,
    actor: Actor,
) -> Identity:
    """Store an identity from a validated create body; 409 when its externalId is taken,
    403 when a key that carries it holds a permission ``caller`` lacks."""
    async with store.transaction("create_identity") as conn:
        if await identity_sql.identity_by_external_id(conn, organization_id, data["externalId"]):
            raise Conflict(TAKEN)
        # The keys that already carry the externalId (their identity was deleted) join it.
        held = await identity_sql.held_by_keys(conn, organization_id, data["externalId"])
        if missing(caller.permissions, sorted(held)) is not None:
            raise Forbidden(STRONGER)
        identity = await _insert(conn, organization_id, data, now)
        if identity.credits is not None or identity.ratelimits is not None:
            # Whether verify spends for this identity's keys, and what it counts: what
            # the caches hold.
            await store.authorization_changed(conn)
        created = _activity(
            activities.IDENTITY_CREATE, identity, actor, now, after=_whole(identity)
        )
        await store.record(conn, created)
    return identity


async def _insert(
    conn: Connection, organization_id: str, data: Mapping[str, Any], now: datetime
) -> Identity:
    identity = Identity(
        id=str(uuid.uuid4()),
        organization_id=organization_id,
        org_seq=await identity_sql.next_place(conn, organization_id),
        external_id=data["externalId"],
        meta=data.get("meta"),
        credits=credit_rules.credits_of(data.get("credits"), now),
        ratelimits=_limits(data.get("ratelimits")),
        created_at=now,
        updated_at=now,
    )
    await identity_sql.insert_identity(conn, identity)
    return identity


async def check_joining(
    store: Store, caller: Key | None, organization_id: str, external_id: str | None
) -> None:
    """Refuse (403) to give a key ``external_id`` when that identity shares credits or
    rate limits and ``caller`` may not change it (``identities:write`` and every
    permission its keys hold): otherwise a key that may only create keys would spend a
    stronger key's shared credits and limits, or lock it out. None: the operator."""
    if caller is None or external_id is None:
        return
    found = await store.identities.identity_of(organization_id, external_id)
    if found is None or (found.credits is None and found.ratelimits is None):
        return
    held = await store.identities.held_by_keys(organization_id, external_id)
    if not has_permission(caller.permissions, "identities:write") or missing(
        caller.permissions, sorted(held)
    ):
        raise Forbidden(JOINING)


async def identity_of(store: Store, key: Key) -> Identity | None:
    """The identity the key belongs to; None for a key without one (no statement for a
    key without an externalId)."""
    if key.external_id is None:
        return None
    return await store.identities.identity_of(key.organization_id, key.external_id)


async def identity_id_of(store: Store, key: Key) -> str | None:
    found = await identity_of(store, key)
    return None if found is None else found.id


async def get_identity(store: Store, organization_id: str, identity_id: str) -> Identity:
    identity = await store.identities.get_identity(organization_id, identity_id)
    if identity is None:
        raise NotFound(NOT_FOUND)
    return identity


async def list_identities(
    store: Store, organization_id: str, after: int, limit: int, external_id: str | None
) -> IdentityPage:
    return await store.identities.list_identities(organization_id, after, limit, external_id)


async def _changeable(
    conn: Connection,
    caller: Key,
    organization_id: str,
    identity_id: str,
    if_match: Collection[str] | None,
    fields: Collection[str],
) -> Identity:
    """The identity as it is in the transaction, once the caller may change ``fields``
    of it: 404, 412 (If-Match), then the escalation and own-identity rules."""
    current = await identity_sql.get_identity(conn, organization_id, identity_id)
    if current is None:
        raise NotFound(NOT_FOUND)
    if if_match is not None and "*" not in if_match and current.etag not in if_match:
        raise PreconditionFailed()
    keys = set(await identity_sql.keys_of(conn, current))
    held = await role_sql.permissions_of_keys(conn, organization_id, keys)
    if missing(caller.permissions, sorted(held)) is not None:
        raise Forbidden(STRONGER)
    if caller.id in keys and any(field in fields for field in _SHARED):
        raise Forbidden(OWN)
    return current


async def update_identity(
    store: Store,
    caller: Key,
    organization_id: str,
    identity_id: str,
    data: Mapping[str, Any],
    if_match: Collection[str] | None,
    actor: Actor,
    now: datetime,
) -> Identity:
    """Apply a validated PATCH body (meta, credits, ratelimits; null clears each) in one
    transaction, with its activity; a change to nothing writes nothing."""
    async with store.transaction("update_identity") as conn:
        current = await _changeable(conn, caller, organization_id, identity_id, if_match, data)
        after = replace(
            current,
            meta=data.get("meta", current.meta),
            credits=credit_rules.credits_of(data["credits"], now)
            if "credits" in data
            else current.credits,
            ratelimits=_limits(data["ratelimits"]) if "ratelimits" in data else current.ratelimits,
            updated_at=now,
        )
        return await _write(store, conn, current, after, actor, now)


async def _write(
    store: Store, conn: Connection, current: Identity, after: Identity, actor: Actor, now: datetime
) -> Identity:
    """Write ``after`` over ``current`` with its activity; nothing when nothing changed."""
    logged = _changed(current, after, actor, now)
    if logged is None:
        return current
    await identity_sql.update_identity(conn, after)
    await store.record(conn, logged)
    if (current.credits is None) != (after.credits is None) or (
        current.ratelimits != after.ratelimits
    ):
        # Whether verify spends for this identity's keys: what the credential caches hold.
        await store.authorization_changed(conn)
    return after


async def change_credits(
    store: Store,
    caller: Key,
    organization_id: str,
    identity_id: str,
    change: Mapping[str, Any],
    actor: Actor,
    now: datetime,
) -> Identity:
    """Apply a validated credits body (exactly one of set, increment, decrement) in one
    transaction, as ``keysvc.domain.keycredits.change_credits`` does for a key."""
    async with store.transaction("change_identity_credits") as conn:
        current = await _changeable(conn, caller, organization_id, identity_id, None, ("credits",))
        if "set" not in change and current.credits is None:
            raise Conflict(UNLIMITED)
        credits = credit_rules.changed(current.credits, dict(change), now)
        after = replace(current, credits=credits, updated_at=now)
        return await _write(store, conn, current, after, actor, now)


async def delete_identity(
    store: Store,
    caller: Key,
    organization_id: str,
    identity_id: str,
    if_match: Collection[str] | None,
    actor: Actor,
    now: datetime,
) -> None:
    """Delete the identity; its keys stay, with their externalId, sharing nothing."""
    async with store.transaction("delete_identity") as conn:
        current = await _changeable(conn, caller, organization_id, identity_id, if_match, _SHARED)
        await identity_sql.delete_identity(conn, current.id)
        if current.credits is not None or current.ratelimits is not None:
            await store.authorization_changed(conn)
        await store.record(
            conn, _activity(activities.IDENTITY_DELETE, current, actor, now, _whole(current))
        )


def decode_cursor(hasher: Hasher, organization_id: str, cursor: str | None) -> int:
    return cursors.decode(hasher, _CURSOR, organization_id, cursor)


def next_cursor(hasher: Hasher, organization_id: str, page: IdentityPage) -> str | None:
    if not page.more:
        return None
    return cursors.encode(hasher, _CURSOR, organization_id, page.identities[-1].org_seq)
