"""What the activity log says of each write: the activities a key or role change
makes, with the public values before and after (never a secret or a hash), who
made it (``Actor``), and the log's signed list cursor.

The types and keyUpdateTypes are upstream's where upstream has one; keysvc adds
the role and webhook events, ``key_used_after_revoke`` and the ``rate-limit-changed``
and ``key-rotated`` updates (``ADDED_TYPES``, ``ADDED_UPDATE_TYPES``). A PATCH makes
one activity per kind of change, each with its keyUpdateType; a PATCH that
changes nothing makes none. A list shows only upstream's kinds of record
(``UPSTREAM_KINDS``) unless asked for keysvc's too (``listed_kinds``), so that a
client generated from upstream's document, whose enums are closed, reads every page.
Recording is ``Store.record``, inside the write's own transaction.
"""

import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from keysvc.credentials import Hasher
from keysvc.domain import cursors
from keysvc.errors import BadRequest
from keysvc.keyview import details
from keysvc.models import (
    Activity,
    ActivityKinds,
    ActivityPage,
    Actor,
    Key,
    Role,
    RoleDetail,
    Webhook,
)
from keysvc.timeutil import to_text

KEY_CREATE, KEY_DELETE, KEY_UPDATE = "key_create", "key_delete", "openapi_key_update"
ROLE_CREATE, ROLE_UPDATE, ROLE_DELETE = "role_create", "role_update", "role_delete"
KEY_USED_AFTER_REVOKE = "key_used_after_revoke"
# A key's secret reported leaked (keysvc.domain.leaks): by revoke-by-secret, the CLI or
# GitHub's secret scanning. Changes nothing a replay compares: a disable it makes is
# recorded beside it as a state-changed update (keysvc.db.replay).
KEY_LEAKED = "key_leaked"
# A batch of keys imported (keysvc.domain.imports): one record, its count and each key's
# values (replayed as creates, keysvc.db.replay).
KEY_IMPORT = "key_import"
WEBHOOK_CREATE, WEBHOOK_DELETE = "webhook_create", "webhook_delete"
# A webhook's secret rotated (keysvc.domain.webhooks.rotate_secret).
WEBHOOK_SECRET_ROTATE = "webhook_secret_rotate"  # noqa: S105 - a type, not a secret
# A webhook enabled or disabled: by PATCH, or by keysvc after failing for long enough.
WEBHOOK_UPDATE = "webhook_update"
# A delivery sent again by hand (keysvc.domain.webhooks.retry_delivery).
WEBHOOK_DELIVERY_RETRY = "webhook_delivery_retry"
# Identity writes (issue 36, keysvc.domain.identities).
IDENTITY_CREATE, IDENTITY_UPDATE = "identity_create", "identity_update"
IDENTITY_DELETE = "identity_delete"
# The state a deleted key's use is recorded with (keysvc.db.keys.CREDENTIAL's tombstones).
DELETED = "deleted"
UPSTREAM_TYPES = (KEY_CREATE, KEY_DELETE, KEY_UPDATE)
ADDED_TYPES = (
    ROLE_CREATE, ROLE_UPDATE, ROLE_DELETE, KEY_USED_AFTER_REVOKE, WEBHOOK_CREATE, WEBHOOK_DELETE,
    KEY_LEAKED, WEBHOOK_SECRET_ROTATE, WEBHOOK_UPDATE, WEBHOOK_DELIVERY_RETRY, KEY_IMPORT,
    IDENTITY_CREATE, IDENTITY_UPDATE, IDENTITY_DELETE,
)  # fmt: skip
RATE_LIMIT_CHANGED, KEY_ROTATED = "rate-limit-changed", "key-rotated"
# Issue 29's updates: externalId, meta and credits (their setting and the POST .../credits
# changes; spends are not recorded: they are counted in usage).
EXTERNAL_ID_CHANGED, META_CHANGED = "external-id-changed", "meta-changed"
CREDITS_CHANGED = "credits-changed"
RATELIMITS_CHANGED = "ratelimits-changed"  # issue 36: a key's named rate limits
ADDED_UPDATE_TYPES = (
    RATE_LIMIT_CHANGED, KEY_ROTATED, EXTERNAL_ID_CHANGED, META_CHANGED, CREDITS_CHANGED,
    RATELIMITS_CHANGED,
)  # fmt: skip
# The keyUpdateTypes keysvc records that upstream's enum has.
UPSTREAM_UPDATE_TYPES = (
    "created", "deleted", "name-changed", "state-changed", "date-changed",
    "ip-access-list-changed", "role-changed",
)  # fmt: skip
UPSTREAM_KINDS = ActivityKinds(UPSTREAM_TYPES, UPSTREAM_UPDATE_TYPES)
# The list's ``include`` that shows every record, keysvc's additions too.
INCLUDE_ADDED = "keysvc"
ACTOR_TYPES = ("system", "api")
# The longest User-Agent kept: enough for any browser's, and a bound on what a
# client can make every record of its writes carry.
MAX_USER_AGENT = 512
SYSTEM = Actor("system")
# What the seal of a database from before the log records its keys and roles as made by.
PRE_LOG = Actor("system", details="existed before the activity log")

# What a key's public view holds, and the keyUpdateType of a change to each field.
_KEY_UPDATES = {
    "name": "name-changed",
    "state": "state-changed",
    "expireAt": "date-changed",
    "ipAccessList": "ip-access-list-changed",
    "assignedRoles": "role-changed",
    "rateLimit": RATE_LIMIT_CHANGED,
    "externalId": EXTERNAL_ID_CHANGED,
    "meta": META_CHANGED,
    "credits": CREDITS_CHANGED,
    "ratelimits": RATELIMITS_CHANGED,
}
# Issue 29's fields are in a key's view only when set, so that the records of keys
# without them read as before.
_UNSET_ABSENT = ("externalId", "meta", "credits", "ratelimits")


def key_view(key: Key) -> dict[str, Any]:
    """The values of a key an activity keeps: what a PATCH can change."""
    return {**_base_view(key), **details(key)}


def _base_view(key: Key) -> dict[str, Any]:
    return key_values(
        key.name, key.state, key.expire_at, key.ip_access_list, key.roles, key.rate_limit
    )


def key_values(
    name: str,
    state: str,
    expire_at: datetime | None,
    ip_access_list: Sequence[Mapping[str, str]],
    roles: Iterable[Role],
    rate_limit: tuple[int, int] | None,
) -> dict[str, Any]:
    """The values a key's records keep of what a PATCH can change, from its parts (a
    key being imported has no ``Key`` yet: keysvc.domain.imports)."""
    return {
        "name": name,
        "state": state,
        "expireAt": None if expire_at is None else to_text(expire_at),
        "ipAccessList": ip_access_list,
        "assignedRoles": [{"roleId": r.id, "roleName": r.name} for r in roles],
        "rateLimit": None
        if rate_limit is None
        else {"limit": rate_limit[0], "windowSeconds": rate_limit[1]},
    }


def key_created(key: Key, actor: Actor, now: datetime) -> Activity:
    return Activity(
        key.organization_id, KEY_CREATE, actor, now, "created", key.id, after=key_view(key)
    )


def pre_log(roles: Sequence[RoleDetail], keys: Sequence[Key], now: datetime) -> list[Activity]:
    """The create records of what an organization from before the log holds: its custom
    roles (with their holders), then its keys (``keysvc.db.contract.Records``)."""
    made = [role_created(detail, PRE_LOG, now) for detail in roles]
    return made + [key_created(key, PRE_LOG, now) for key in keys]


def announcer(actor: Actor, now: datetime) -> Callable[[Key], Activity]:
    """The activity of a create by ``actor``, once its key is made (``Store.create_key``)."""
    return lambda key: key_created(key, actor, now)


def key_deleted(key: Key, actor: Actor, now: datetime) -> Activity:
    return Activity(
        key.organization_id, KEY_DELETE, actor, now, "deleted", key.id, before=key_view(key)
    )


def key_changed(before: Key, after: Key, actor: Actor, now: datetime) -> list[Activity]:
    """One activity per kind of change from ``before`` to ``after``; none if none changed."""
    old, new = key_view(before), key_view(after)
    for field in _UNSET_ABSENT:
        old.setdefault(field, None)
        new.setdefault(field, None)
    return [
        Activity(
            after.organization_id,
            KEY_UPDATE,
            actor,
            now,
            update,
            after.id,
            before={field: old[field]},
            after={field: new[field]},
        )
        for field, update in _KEY_UPDATES.items()
        if old[field] != new[field]
    ]


def revokes(logged: Sequence[Activity]) -> bool:
    """Whether the change ``logged`` records disables a key: a revocation, which no
    write budget or queue limit refuses (``keysvc.db.quota``)."""
    return any(
        activity.key_update_type == "state-changed"
        and isinstance(activity.after, Mapping)
        and activity.after.get("state") == "disabled"
        for activity in logged
    )


def key_rotated(before: Key, after: Key, actor: Actor, now: datetime) -> Activity:
    """A rotation: which key ID suffix the key answered to, which it answers to now, and
    until when the replaced credentials still work (null: no longer)."""

    def view(key: Key) -> dict[str, Any]:
        until = key.previous_until
        return {
            "keySuffix": key.key_suffix,
            "previousCredentialExpiresAt": None if until is None else to_text(until),
        }

    return Activity(
        after.organization_id, KEY_UPDATE, actor, now, KEY_ROTATED, after.id,
        before=view(before), after=view(after),
    )  # fmt: skip


def key_used_after_revoke(key: Key, actor: Actor, now: datetime) -> Activity:
    """A request with valid credentials of a disabled or deleted key (``after``'s state
    says which): the actor is that key."""
    return Activity(
        key.organization_id, KEY_USED_AFTER_REVOKE, actor, now, target_key_id=key.id,
        after={"state": key.state},
    )  # fmt: skip


def key_leaked(key: Key, actor: Actor, now: datetime, report: Mapping[str, Any]) -> Activity:
    """A report that the key's secret leaked: ``report`` holds who reported it, where it
    was found (GitHub's ``url`` and ``source``) and what was done (never the secret)."""
    return Activity(
        key.organization_id, KEY_LEAKED, actor, now, target_key_id=key.id, after=dict(report)
    )


def role_view(detail: RoleDetail) -> dict[str, Any]:
    return {
        "name": detail.role.name,
        "permissions": list(detail.role.permissions),
        "actors": list(detail.actors),
    }


def role_created(detail: RoleDetail, actor: Actor, now: datetime) -> Activity:
    return Activity(
        detail.organization_id, ROLE_CREATE, actor, now, target_role_id=detail.role.id,
        after=role_view(detail),
    )  # fmt: skip


def role_changed(
    before: RoleDetail, after: RoleDetail, actor: Actor, now: datetime
) -> Activity | None:
    """The activity of a role change, with only the fields that changed; None if none did."""
    old, new = role_view(before), role_view(after)
    changed = [field for field in old if old[field] != new[field]]
    if not changed:
        return None
    return Activity(
        after.organization_id, ROLE_UPDATE, actor, now, target_role_id=after.role.id,
        before={f: old[f] for f in changed}, after={f: new[f] for f in changed},
    )  # fmt: skip


def role_deleted(detail: RoleDetail, actor: Actor, now: datetime) -> Activity:
    return Activity(
        detail.organization_id, ROLE_DELETE, actor, now, target_role_id=detail.role.id,
        before=role_view(detail),
    )  # fmt: skip


def webhook_view(webhook: Webhook) -> dict[str, Any]:
    """What a webhook's activity keeps: never its secret or the nonce it comes from."""
    return {
        "webhookId": webhook.id,
        "url": webhook.url,
        "events": list(webhook.events),
        "expiringDays": webhook.expiring_days,
    }


def webhook_created(webhook: Webhook, actor: Actor, now: datetime) -> Activity:
    return Activity(
        webhook.organization_id, WEBHOOK_CREATE, actor, now, after=webhook_view(webhook)
    )


def webhook_deleted(webhook: Webhook, actor: Actor, now: datetime) -> Activity:
    return Activity(
        webhook.organization_id, WEBHOOK_DELETE, actor, now, before=webhook_view(webhook)
    )


def bounded_user_agent(value: str | None) -> str | None:
    """The User-Agent as kept: at most MAX_USER_AGENT characters, with control
    characters and what cannot be stored as UTF-8 (a lone surrogate from a header's
    undecodable bytes) replaced by U+FFFD, so that neither a log line nor the JSON it
    is rendered in can be broken by it."""
    if not value:
        return None
    text = value[:MAX_USER_AGENT].encode("utf-8", "replace").decode("utf-8")
    return "".join("\ufffd" if unicodedata.category(ch) == "Cc" else ch for ch in text)


def api_actor(key: Key, address: object | None, user_agent: str | None) -> Actor:
    """A key calling over the API, from the client ``address`` keysvc believes."""
    return Actor(
        "api", key.id, None if address is None else str(address), bounded_user_agent(user_agent)
    )


BAD_CURSOR = cursors.BAD_CURSOR
BAD_RANGE = "from_date: must not be after to_date"
_CURSOR = "activity cursor"


def decode_cursor(hasher: Hasher, organization_id: str, cursor: str | None) -> int:
    """The place in the chain a cursor stands for; 0 for none; a forged one is a 400."""
    return cursors.decode(hasher, _CURSOR, organization_id, cursor)


def next_cursor(hasher: Hasher, organization_id: str, page: ActivityPage) -> str | None:
    if not page.more:
        return None
    return cursors.encode(hasher, _CURSOR, organization_id, page.activities[-1].org_seq)


def listed_kinds(params: Mapping[str, Any]) -> ActivityKinds | None:
    """The kinds of record a list shows: upstream's, or with ``include=keysvc`` every one
    (None)."""
    return None if params.get("include") == INCLUDE_ADDED else UPSTREAM_KINDS


def check_range(params: Mapping[str, Any]) -> None:
    since, until = params.get("from_date"), params.get("to_date")
    if since is not None and until is not None and since > until:
        raise BadRequest(BAD_RANGE)


def webhook_secret_rotated(webhook: Webhook, actor: Actor, now: datetime) -> Activity:
    """A rotation: the webhook, and until when its previous secret signs too (never a
    secret or a nonce)."""
    assert webhook.previous_until is not None  # set by the rotation itself
    after = {**webhook_view(webhook), "previousSecretExpiresAt": to_text(webhook.previous_until)}
    return Activity(webhook.organization_id, WEBHOOK_SECRET_ROTATE, actor, now, after=after)


def webhook_enabled_changed(webhook: Webhook, actor: Actor, now: datetime) -> Activity:
    """``webhook`` (as it is now) enabled or disabled: by a PATCH, or by keysvc itself."""
    ids = {"webhookId": webhook.id, "url": webhook.url}
    before, after = {**ids, "enabled": not webhook.enabled}, {**ids, "enabled": webhook.enabled}
    return Activity(webhook.organization_id, WEBHOOK_UPDATE, actor, now, before=before, after=after)


def webhook_delivery_retried(
    webhook: Webhook, delivery_id: str, event_type: str, actor: Actor, now: datetime
) -> Activity:
    """A delivery of ``webhook`` sent again by hand: which one, and its event's type."""
    after = {"webhookId": webhook.id, "url": webhook.url, "deliveryId": delivery_id,
             "eventType": event_type}  # fmt: skip
    return Activity(webhook.organization_id, WEBHOOK_DELIVERY_RETRY, actor, now, after=after)
