"""What a delivery's signature covers, through the real app to a real receiver: the
event ID and type headers as well as the body, so that a changed header fails the
receiver of docs/concepts/events.md; and that receiver handles an event ID once,
answering a repeat (a retry, or a replay of a recorded request within the tolerance)
without handling it again."""

import hashlib
import hmac
import re
from pathlib import Path
from typing import Any

from keysvc.config import Settings
from tests.api.webhooks import create_webhook, private_client
from tests.helpers import ClientFactory, FakeClock, bootstrap, create
from tests.receiver import Received, Receiver

# The webhooks section moved from the README to the docs site (issue 38).
PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "events.md"


def readme_receiver() -> dict[str, Any]:
    """The docs/concepts/events.md's receiver sample, run as written, in a namespace of its own."""
    (snippet,) = [
        block
        for block in re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
        if "Keysvc-Signature" in block  # the receiver's, not the client's examples
    ]
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    return namespace


async def delivered(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> tuple[str, Received]:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    hook = await create_webhook(client, admin, {"url": receiver.url, "events": ["key.created"]})
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    (got,) = await receiver.wait_for(lambda received: len(received) >= 1)
    return hook["secret"], got


async def test_the_signature_covers_the_event_id_and_type(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    secret, got = await delivered(aiohttp_client, settings, clock, receiver)
    fields = dict(part.split("=", 1) for part in got.headers["Keysvc-Signature"].split(","))
    # v1, over the body alone, is sent again beside v2 for receivers not yet moved.
    assert list(fields) == ["t", "v1", "v2"]
    v1 = hmac.new(secret.encode(), f"{fields['t']}.".encode() + got.body, hashlib.sha256)
    assert fields["v1"] == v1.hexdigest()
    event_id, event_type = got.headers["Keysvc-Event-Id"], got.headers["Keysvc-Event-Type"]
    assert (event_id, event_type) == (got.event["id"], "key.created")
    signed = f"{fields['t']}.{event_id}.{event_type}.".encode() + got.body
    assert fields["v2"] == hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


async def test_the_readme_receiver_refuses_a_changed_header(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    verify = readme_receiver()["verify"]
    secret, got = await delivered(aiohttp_client, settings, clock, receiver)
    assert verify(secret, got.headers, got.body)
    for name, value in [
        ("Keysvc-Event-Type", "key.deleted"),
        ("Keysvc-Event-Id", "00000000-0000-4000-8000-000000000000"),
    ]:
        assert not verify(secret, {**got.headers, name: value}, got.body)


async def test_the_readme_receiver_handles_an_event_id_once(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    sample = readme_receiver()
    secret, got = await delivered(aiohttp_client, settings, clock, receiver)
    handled: list[dict[str, Any]] = []
    assert sample["receive"](secret, got.headers, got.body, handled.append) == 200
    assert handled == [got.event]
    # The same request again (a replay within the tolerance, or keysvc's retry).
    assert sample["receive"](secret, got.headers, got.body, handled.append) == 200
    assert handled == [got.event]
    forged = {**got.headers, "Keysvc-Signature": "t=1,v2=00"}
    assert sample["receive"](secret, forged, got.body, handled.append) == 401
    assert handled == [got.event]
