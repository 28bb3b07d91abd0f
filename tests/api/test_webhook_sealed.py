"""What a database writer without the pepper can make keysvc send, through the real app
on a real database and to real receivers: a delivery row written by hand is not sent
(its MAC, made with a key from the pepper, does not verify) and is marked failed; a
webhooks row with another webhook's nonce cannot be added, and a webhook whose URL is
changed by hand no longer signs with its secret (the secret is bound to the webhook's
ID, organization and URL); a webhook made before the upgrade keeps its secret."""

import asyncio
import hashlib
import hmac
import uuid
from base64 import urlsafe_b64encode
from collections.abc import AsyncIterator

import pytest

from keysvc.config import Settings
from keysvc.credentials import WEBHOOK_SECRET_PREFIX, WEBHOOK_SIGNING
from keysvc.db.sqlite.migrations import MIGRATIONS, WEBHOOK_BINDING_STEP, schema_version
from tests.api.webhooks import attempted, create_webhook, private_client
from tests.handsql import hand_sql, hand_transaction, hand_value
from tests.helpers import Client, ClientFactory, Creds, FakeClock, bootstrap, create
from tests.receiver import Receiver, signature_valid
from tests.rewind import WEBHOOK_BINDING_UNDO

# The columns of a delivery row as the version before outbox MACs had them.
DELIVERY_COLUMNS = (
    "webhook_id, event_id, event_type, body, created_at, give_up_at, state, next_attempt_at"
)

# A second webhooks row (new ID, another URL) with a webhook's nonce, as a writer without
# the pepper would add to get deliveries signed with that webhook's secret.
COPY_WEBHOOK = (
    "insert into webhooks (id, organization_id, url, events, expiring_days, nonce,"
    " created_at) select ?, organization_id, ?, events, expiring_days, nonce, created_at"
    " from webhooks where id = ?"
)


@pytest.fixture
async def other() -> AsyncIterator[Receiver]:
    """A second receiver: the attacker's."""
    started = await Receiver().start()
    yield started
    await started.stop()


async def _webhook(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> tuple[Client, Creds, str, str]:
    """A client, its admin, and a webhook of key.created to ``receiver``: its ID and secret."""
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    body = {"url": receiver.url, "events": ["key.created"]}
    created = await create_webhook(client, admin, body)
    return client, admin, created["webhook"]["id"], created["secret"]


async def _one_delivered(client: Client, admin: Creds, receiver: Receiver, webhook_id: str) -> None:
    """A key created, and its event delivered and recorded (the hand SQL that follows
    blocks the event loop, so no write of the app's may be under way)."""
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    await receiver.wait_for(lambda got: len(got) >= 1)
    await attempted(client, admin, webhook_id)


def _forge_delivery(settings: Settings, webhook_id: str, body: str) -> str:
    """A pending delivery of ``body`` for the webhook, written by hand as a copy of its
    first delivery with a new event; its event ID."""
    event_id = str(uuid.uuid4())
    hand_sql(
        settings,
        f"insert into webhook_deliveries (id, {DELIVERY_COLUMNS})"
        " select ?, webhook_id, ?, 'key.deleted', ?, created_at, give_up_at, 'pending',"
        " give_up_at - 86400 from webhook_deliveries where webhook_id = ? order by seq limit 1",
        str(uuid.uuid4()),
        event_id,
        body,
        webhook_id,
    )
    return event_id


async def test_a_delivery_row_written_by_hand_is_not_sent(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, admin, webhook_id, _ = await _webhook(aiohttp_client, settings, clock, receiver)
    await _one_delivered(client, admin, receiver, webhook_id)
    body = '{"forged":"a body keysvc never wrote"}'
    event_id = _forge_delivery(settings, webhook_id, body)

    log = await attempted(client, admin, webhook_id, count=2)
    (forged,) = [d for d in log if d["eventId"] == event_id]
    assert forged["state"] == "failed"
    assert [(a["status"], a["error"]) for a in forged["attempts"]] == [(None, "unauthenticated")]
    await asyncio.sleep(0.5)
    assert len(receiver.received) == 1  # the real event only
    refused = [r for r in caplog.records if "MAC" in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in refused]
    assert "forged" not in refused[0].getMessage()


async def test_a_sealed_row_copied_with_another_body_is_not_sent(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    """The MAC covers the body: a real row's MAC put beside another body fails."""
    client, admin, webhook_id, _ = await _webhook(aiohttp_client, settings, clock, receiver)
    await _one_delivered(client, admin, receiver, webhook_id)
    event_id = str(uuid.uuid4())
    hand_sql(
        settings,
        f"insert into webhook_deliveries (id, mac, {DELIVERY_COLUMNS})"
        " select id || '-copy', mac, webhook_id, ?, event_type, ?, created_at, give_up_at,"
        " 'pending', give_up_at - 86400 from webhook_deliveries where webhook_id = ?",
        event_id,
        '{"forged":true}',
        webhook_id,
    )
    log = await attempted(client, admin, webhook_id, count=2)
    (forged,) = [d for d in log if d["eventId"] == event_id]
    assert (forged["state"], forged["attempts"][0]["error"]) == ("failed", "unauthenticated")
    assert len(receiver.received) == 1


async def test_a_webhooks_row_with_a_copied_nonce_cannot_be_added(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    other: Receiver,
) -> None:
    client, admin, webhook_id, _ = await _webhook(aiohttp_client, settings, clock, receiver)
    with pytest.raises(Exception, match=r"(?i)unique"):
        hand_sql(settings, COPY_WEBHOOK, str(uuid.uuid4()), other.url, webhook_id)
    await _one_delivered(client, admin, receiver, webhook_id)
    await asyncio.sleep(0.3)
    assert other.received == []


async def test_a_webhook_whose_url_is_changed_by_hand_no_longer_signs_with_its_secret(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    other: Receiver,
) -> None:
    client, admin, webhook_id, secret = await _webhook(aiohttp_client, settings, clock, receiver)
    await _one_delivered(client, admin, receiver, webhook_id)
    assert signature_valid(secret, receiver.received[0])
    hand_sql(settings, "update webhooks set url = ? where id = ?", other.url, webhook_id)
    await create(client, admin, {"name": "y", "roles": ["developer"]})
    (got,) = await other.wait_for(lambda received: len(received) >= 1)
    assert not signature_valid(secret, got)


def _pepper(settings: Settings) -> bytes:
    return settings.pepper or settings.pepper_path.read_bytes().strip()


def _old_secret(pepper: bytes, nonce: bytes) -> str:
    """The secret as keysvc derived it before the upgrade: from the nonce alone."""
    derived = hmac.new(pepper, WEBHOOK_SIGNING, hashlib.sha256).digest()
    secret = hmac.new(derived, nonce, hashlib.sha256).digest()
    return WEBHOOK_SECRET_PREFIX + urlsafe_b64encode(secret).decode().rstrip("=")


def _back_to_the_version_before(settings: Settings) -> None:
    """The database as the version before this step left it: no outbox MACs, no secret
    versions, no unique nonces, nor what the steps after it make (they are then run
    again at the next start)."""
    before = schema_version(MIGRATIONS[: MIGRATIONS.index(WEBHOOK_BINDING_STEP)])
    undo = [
        ("drop index activities_org_time", ()),
        ("drop index webhook_deliveries_waiting", ()),
        ("drop table write_budgets", ()),
        ("drop table activity_anchors", ()),
        *((statement, ()) for statement in WEBHOOK_BINDING_UNDO),
    ]
    if settings.db_url is None:
        undo.append((f"pragma user_version = {before}", ()))
    else:
        undo.append(("update meta set value = ? where name = 'schema_version'", (str(before),)))
    hand_transaction(settings, *undo)


async def test_a_webhook_made_before_the_upgrade_keeps_its_secret(
    aiohttp_client: ClientFactory,
    settings: Settings,
    clock: FakeClock,
    receiver: Receiver,
    other: Receiver,
) -> None:
    """Its secret is still derived from its nonce alone, so its receiver verifies on; a
    copy of its row added before the upgrade (when nothing refused it) is sent nothing
    signed with that secret."""
    client, admin, webhook_id, _ = await _webhook(aiohttp_client, settings, clock, receiver)
    await client.close()
    _back_to_the_version_before(settings)
    nonce = hand_value(settings, "select nonce from webhooks where id = ?", webhook_id)
    old_secret = _old_secret(_pepper(settings), bytes(nonce))
    hand_sql(settings, COPY_WEBHOOK, str(uuid.uuid4()), other.url, webhook_id)

    client = await private_client(aiohttp_client, settings, clock)
    version = "select secret_version from webhooks where id = ?"
    assert hand_value(settings, version, webhook_id) == 1
    await _one_delivered(client, admin, receiver, webhook_id)
    assert signature_valid(old_secret, receiver.received[0])
    await asyncio.sleep(0.5)
    assert not any(signature_valid(old_secret, got) for got in other.received)
    log = await attempted(client, admin, webhook_id)
    assert log[0]["state"] == "delivered"
