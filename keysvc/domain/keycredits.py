"""Credits on a key through the store (issue 29): a verify's spend (from its identity's
credits too, issue 36), a due refill applied when the key is read, and
``POST .../keys/{keyId}/credits``. The rules are ``keysvc.domain.credits``'s; each runs
in one write transaction of the store's, the spend through ``Store.spend_credits`` or
``Store.spend_shared`` (never from a cache)."""

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from keysvc.db import keys as key_sql
from keysvc.db.contract import Store
from keysvc.domain import activities
from keysvc.domain import credits as rules
from keysvc.domain.keys import NOT_FOUND, announce_change, list_keys, may_change
from keysvc.errors import Conflict, Forbidden, NotFound
from keysvc.keyview import api_key, credits_json
from keysvc.models import Actor, Credits, Key, KeyPage, Spend, Spent

UNLIMITED = (
    'the key\'s credits are unlimited: set a number first ({"set": n}), then increment'
    " or decrement it"
)
OWN_CREDITS = "a key cannot change its own credits: use another key to change them"


def _events(key: Key, after: Credits, names: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each credit event's type and data: the key as it is after the spend."""
    if not names:
        return []
    data = api_key(replace(key, credits=after))
    return [(name, data) for name in names]


async def spend(store: Store, key: Key, cost: int, now: datetime) -> Spent | None:
    """Spend ``cost`` at ``now`` (a due refill first), exactly, from the key's credits
    and from its identity's (issue 36): both enough, or neither spent. None when both
    are unlimited. Whether the identity has credits is cached (``IdentityReads.sharing``);
    how many, never."""

    def rule(stored: Credits) -> Spend:
        allowed, after, names = rules.spent(stored, cost, now)
        return Spend(allowed, after, _events(key, after, names))

    identity_id = None
    if key.external_id is not None:
        known, identity_id = store.identities.sharing_here(key.organization_id, key.external_id)
        if not known:
            identity_id = await store.identities.sharing(key.organization_id, key.external_id)
    if identity_id is None:
        if key.credits is None:
            return None
        return Spent(await store.spend_credits(key.organization_id, key.id, now, rule))
    shared_id, external_id = identity_id, key.external_id
    assert external_id is not None

    def identity_rule(stored: Credits) -> Spend:
        allowed, after, names = rules.spent(stored, cost, now)
        if not names:  # most spends: no event, so no event data
            return Spend(allowed, after)
        data = {"id": shared_id, "externalId": external_id, "credits": credits_json(after)}
        return Spend(allowed, after, [(_IDENTITY_EVENTS[name], data) for name in names])

    return await store.spend_shared(
        key.organization_id, key.id, external_id, now, rule, identity_rule
    )


# The identity's credit events (keysvc.domain.webhooks), by the key's of the same kind.
_IDENTITY_EVENTS = {
    rules.CREDITS_LOW: "identity.credits_low",
    rules.CREDITS_EXHAUSTED: "identity.credits_exhausted",
}


async def refreshed(store: Store, key: Key, now: datetime) -> Key:
    """The key with a refill due by ``now`` applied and stored (the same key when none
    is due): a refill is applied on the next use or read."""
    if not _refill_due(key, now):
        return key
    await _refill(store, key, now)
    fresh = await store.get_key(key.organization_id, key.id)
    return key if fresh is None else fresh


def _refill_due(key: Key, now: datetime) -> bool:
    return key.credits is not None and rules.settled(key.credits, now) is not key.credits


async def _refill(store: Store, key: Key, now: datetime) -> None:
    """The refill due by ``now`` applied to the key's stored credits."""
    await store.spend_credits(
        key.organization_id, key.id, now, lambda stored: Spend(True, rules.settled(stored, now))
    )


async def list_refreshed(
    store: Store,
    organization_id: str,
    after: int,
    limit: int,
    external_id: str | None,
    now: datetime,
) -> KeyPage:
    """A page of keys (``keysvc.domain.keys.list_keys``), a refill due on any of them
    applied first."""
    page = await list_keys(store, organization_id, after, limit, external_id)
    due = [key for key in page.keys if _refill_due(key, now)]
    if not due:
        return page
    for key in due:
        await _refill(store, key, now)
    return await list_keys(store, organization_id, after, limit, external_id)


async def change_credits(
    store: Store,
    caller: Key,
    organization_id: str,
    key_id: str,
    change: Mapping[str, Any],
    actor: Actor,
    now: datetime,
) -> Key:
    """Apply a validated credits body (exactly one of set, increment, decrement) in one
    transaction, recorded as a ``credits-changed`` update with the ``key.updated`` event.
    The key must be no stronger than the caller, and not the caller itself."""
    if key_id == caller.id:
        raise Forbidden(OWN_CREDITS)
    async with store.transaction("change_credits") as conn:
        current = await key_sql.get_key(conn, organization_id, key_id)
        if current is None:
            raise NotFound(NOT_FOUND)
        may_change(caller, current)
        if "set" not in change and current.credits is None:
            raise Conflict(UNLIMITED)
        after = rules.changed(current.credits, dict(change), now)
        await key_sql.write_details(
            conn, key_id, current.external_id, current.meta, after, current.ratelimits
        )
        changed = await key_sql.get_key(conn, organization_id, key_id)
        assert changed is not None
        if (current.credits is None) != (after is None):
            # Whether verify spends for this key: what the credential caches hold.
            await store.authorization_changed(conn)
        logged = activities.key_changed(current, changed, actor, now)
        await announce_change(store, conn, changed, logged, now)
    return changed
