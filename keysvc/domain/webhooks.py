"""Webhook subscriptions and the events keysvc sends them: the rules of a subscription
(its URL, events and limits), its signing secret, shown once, and the delivery log's
signed cursor. A write sends an event with ``Store.enqueue``, inside its transaction:
the event goes to the organization's webhooks subscribed to its type, and is delivered
only if that transaction commits, then at least once; its data holds public fields
only, never a secret or a hash. A webhook with its queue full, or an organization past
its write budget, refuses the write (429, ``keysvc.db.quota``). A create and a delete
are recorded in the activity log in their own transaction
(``keysvc.domain.activities.webhook_created``), without the secret.

Controls: a secret's rotation (the replaced one signs too for an overlap), a manual
retry of one delivery, and enable or disable; a webhook that has failed every attempt
for ``webhook_disable_after_hours`` is disabled by the delivery task
(``attempt_recorded``), and its organization's other webhooks are sent ``webhook.disabled``.

A webhook's secret is not stored: the webhook keeps a random nonce (unique), and the
secret is derived from it, the webhook's ID, organization and URL with a key that
comes from the pepper (``Hasher.webhook_secret``); a new one is shown in Standard
Webhooks' ``whsec_<base64>`` form (``keysvc.domain.signing``).
"""

import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from keysvc.credentials import Hasher
from keysvc.db import webhooks as webhook_sql
from keysvc.db.contract import Connection, Store
from keysvc.domain import activities, cursors
from keysvc.domain.limits import DEFAULT_EXPIRING_DAYS, MAX_WEBHOOKS_PER_ORG
from keysvc.domain.permissions import has_permission
from keysvc.domain.signing import signing_secret
from keysvc.domain.targets import check_addresses, parse_url
from keysvc.errors import Conflict, Forbidden, NotFound, TooManyRequests
from keysvc.models import Actor, Delivery, Key, Webhook
from keysvc.timeutil import to_text

logger = logging.getLogger("keysvc")

NONCE_BYTES = 32
NOT_FOUND = "webhook not found in this organization"
DELIVERY_NOT_FOUND = "delivery not found for this webhook"
DISABLED = "this webhook is disabled: enable it first (PATCH it with enabled: true), then retry"
# The event sent to an organization's other webhooks when one is disabled for failing.
WEBHOOK_DISABLED = "webhook.disabled"
_CURSOR = "webhook deliveries position"
# A key event's data is the key's public view: a subscription to one reads keys, so
# it asks for what reading them asks for.
KEY_EVENTS_NEED = "keys:read"
KEY_EVENTS_REFUSED = (
    f"events: subscribing to key events also needs the permission {KEY_EVENTS_NEED},"
    " which this key lacks: create the webhook with a key that holds it"
)
# Issue 36: an identity's credit events carry its credits.
IDENTITY_EVENTS_NEED = "identities:read"
IDENTITY_EVENTS_REFUSED = (
    f"events: subscribing to identity events also needs the permission {IDENTITY_EVENTS_NEED},"
    " which this key lacks: create the webhook with a key that holds it"
)


@dataclass(frozen=True)
class Created:
    """A stored webhook, and its signing secret (shown once)."""

    webhook: Webhook
    secret: str


@dataclass(frozen=True)
class Rotated:
    """A webhook after its secret's rotation, and its new secret (shown once)."""

    webhook: Webhook
    secret: str


@dataclass(frozen=True)
class DeliveryPage:
    deliveries: list[Delivery]
    more: bool
    total: int


async def create_webhook(
    store: Store,
    hasher: Hasher,
    caller: Key,
    organization_id: str,
    data: dict[str, Any],
    now: datetime,
    allow_private: bool,
    actor: Actor,
) -> Created:
    """Store a webhook from a validated body; its URL's host must be public unless
    ``allow_private`` (``keysvc.domain.targets``). Its events' data must be data ``caller``
    may read (``KEY_EVENTS_NEED``)."""
    if any(event.startswith("key.") for event in data["events"]) and not has_permission(
        caller.permissions, KEY_EVENTS_NEED
    ):
        raise Forbidden(KEY_EVENTS_REFUSED)
    if any(event.startswith("identity.") for event in data["events"]) and not has_permission(
        caller.permissions, IDENTITY_EVENTS_NEED
    ):
        raise Forbidden(IDENTITY_EVENTS_REFUSED)
    url = parse_url(data["url"])
    await check_addresses(url, allow_private)
    events = tuple(dict.fromkeys(data["events"]))
    nonce = secrets.token_bytes(NONCE_BYTES)
    webhook_id = str(uuid.uuid4())
    async with store.transaction("create_webhook") as conn:
        if await webhook_sql.count_webhooks(conn, organization_id) >= MAX_WEBHOOKS_PER_ORG:
            raise Conflict(
                f"this organization has reached its limit of {MAX_WEBHOOKS_PER_ORG} webhooks;"
                " delete one first"
            )
        webhook = await webhook_sql.insert_webhook(
            conn,
            webhook_id,
            organization_id,
            str(url),
            events,
            data.get("expiringDays", DEFAULT_EXPIRING_DAYS),
            nonce,
            now,
        )
        await store.record(conn, activities.webhook_created(webhook, actor, now))
    secret = signing_secret(
        hasher, nonce, webhook_sql.STANDARD_SECRET, webhook.id, organization_id, webhook.url
    )
    return Created(webhook, secret.shown)


async def list_webhooks(store: Store, organization_id: str) -> list[Webhook]:
    return await store.list_webhooks(organization_id)


async def get_webhook(store: Store, organization_id: str, webhook_id: str) -> Webhook:
    webhook = await store.get_webhook(organization_id, webhook_id)
    if webhook is None:
        raise NotFound(NOT_FOUND)
    return webhook


async def delete_webhook(
    store: Store, organization_id: str, webhook_id: str, actor: Actor, now: datetime
) -> None:
    """Delete the webhook, and with it its deliveries, pending ones included."""
    async with store.transaction("delete_webhook") as conn:
        webhook = await webhook_sql.get_webhook(conn, organization_id, webhook_id)
        if webhook is None or not await webhook_sql.delete_webhook(
            conn, organization_id, webhook_id
        ):
            raise NotFound(NOT_FOUND)
        await store.record(conn, activities.webhook_deleted(webhook, actor, now))


async def rotate_secret(
    store: Store,
    hasher: Hasher,
    organization_id: str,
    webhook_id: str,
    overlap_seconds: int,
    actor: Actor,
    now: datetime,
) -> Rotated:
    """Give the webhook a new secret (a new nonce, shown in the ``whsec_`` form); the one
    it replaces signs its deliveries too for ``overlap_seconds`` (0: not at all). A
    secret replaced before, still in its overlap, stops signing. Recorded as an activity."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    until = now + timedelta(seconds=overlap_seconds)
    async with store.transaction("rotate_webhook_secret") as conn:
        webhook = await webhook_sql.rotate_secret(conn, organization_id, webhook_id, nonce, until)
        if webhook is None:
            raise NotFound(NOT_FOUND)
        await store.record(conn, activities.webhook_secret_rotated(webhook, actor, now))
    secret = signing_secret(
        hasher, nonce, webhook_sql.STANDARD_SECRET, webhook.id, organization_id, webhook.url
    )
    return Rotated(webhook, secret.shown)


async def deliveries(
    store: Store, hasher: Hasher, organization_id: str, webhook_id: str, cursor: str | None,
    limit: int,
) -> tuple[DeliveryPage, str | None]:  # fmt: skip
    """A page of the webhook's deliveries, newest first, and the next page's cursor."""
    await get_webhook(store, organization_id, webhook_id)
    before = None if cursor is None else cursors.decode(hasher, _CURSOR, webhook_id, cursor)
    found, more, total = await store.delivery_page(webhook_id, before, limit)
    following = None
    if more:
        following = cursors.encode(hasher, _CURSOR, webhook_id, found[-1].seq)
    return DeliveryPage(found, more, total), following


def text_or_none(moment: datetime | None) -> str | None:
    return None if moment is None else to_text(moment)


def webhook_data(webhook: Webhook) -> dict[str, Any]:
    """A webhook as an event's data (``webhook.disabled``): its public fields, as GET
    shows them; never its secret or nonce."""
    return {
        "id": webhook.id,
        "url": webhook.url,
        "events": list(webhook.events),
        "expiringDays": webhook.expiring_days,
        "createdAt": to_text(webhook.created_at),
        "enabled": webhook.enabled,
        "disabledAt": text_or_none(webhook.disabled_at),
        "failingSince": text_or_none(webhook.failing_since),
    }


async def attempt_recorded(
    store: Store, conn: Connection, organization_id: str, webhook_id: str, delivered: bool,
    at: datetime, disable_after_hours: int,
) -> None:  # fmt: skip
    """Inside the transaction that records an attempt: the webhook's failure clock
    (stopped by a delivered attempt, started by a failed one); a webhook that has failed
    every attempt for ``disable_after_hours`` (0: never) is disabled, the organization's
    other webhooks sent ``webhook.disabled``, and an activity recorded."""
    await webhook_sql.attempted(conn, webhook_id, delivered, at.timestamp())
    if delivered or not disable_after_hours:
        return
    since = at - timedelta(hours=disable_after_hours)
    if not await webhook_sql.disable_failing(conn, webhook_id, at, since.timestamp()):
        return
    webhook = await webhook_sql.get_webhook(conn, organization_id, webhook_id)
    assert webhook is not None  # disabled just now, in this transaction
    failing = text_or_none(webhook.failing_since)
    actor = Actor(
        "system", details=f"every delivery attempt failed since {failing}"
        f" ({disable_after_hours} hours or more: KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS)",
    )  # fmt: skip
    await store.record(conn, activities.webhook_enabled_changed(webhook, actor, at))
    try:
        await store.enqueue(conn, organization_id, WEBHOOK_DISABLED, webhook_data(webhook), at)
    except TooManyRequests:
        # A subscriber's queue, or the organization's write budget, is full (the budget
        # may keep this event's bytes: it is past its limit anyway). The disable and its
        # activity stand.
        logger.warning("webhook.disabled of webhook %s not queued: a queue is full", webhook_id)
    logger.warning("webhook %s disabled: every attempt failed since %s", webhook_id, failing)


async def set_enabled(
    store: Store, organization_id: str, webhook_id: str, enabled: bool, actor: Actor,
    now: datetime,
) -> Webhook:  # fmt: skip
    """Enable the webhook (its failure clock starts again from nothing) or disable it;
    a change is recorded as an activity."""
    async with store.transaction("update_webhook") as conn:
        changed = await webhook_sql.set_enabled(conn, organization_id, webhook_id, enabled, now)
        webhook = await webhook_sql.get_webhook(conn, organization_id, webhook_id)
        if webhook is None:
            raise NotFound(NOT_FOUND)
        if changed:
            await store.record(conn, activities.webhook_enabled_changed(webhook, actor, now))
    return webhook


async def retry_delivery(
    store: Store,
    organization_id: str,
    webhook_id: str,
    delivery_id: str,
    actor: Actor,
    now: datetime,
) -> Delivery:
    """Attempt the webhook's delivery again, now: its event, body and webhook-id as
    before. A delivery that had failed gets one attempt more; a pending one keeps its
    retries (one under way now is left to that attempt). 404 if this organization's
    webhook has no such delivery; 409 while the webhook is disabled. Recorded as
    ``actor``'s ``webhook_delivery_retry`` activity, in the same transaction."""
    async with store.transaction("retry_webhook_delivery") as conn:
        webhook = await webhook_sql.get_webhook(conn, organization_id, webhook_id)
        if webhook is None:
            raise NotFound(NOT_FOUND)
        if not webhook.enabled:
            raise Conflict(DISABLED)
        found = await webhook_sql.redeliver(conn, webhook_id, delivery_id, now.timestamp())
        if found is None:
            raise NotFound(DELIVERY_NOT_FOUND)
        seq, event_type = found
        retried = activities.webhook_delivery_retried(webhook, delivery_id, event_type, actor, now)
        await store.record(conn, retried)
    page, _, _ = await store.delivery_page(webhook_id, seq + 1, 1)
    if not page or page[0].id != delivery_id:
        raise NotFound(DELIVERY_NOT_FOUND)  # the webhook deleted meanwhile
    return page[0]
