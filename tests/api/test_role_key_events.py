"""What a key or role PATCH leaves behind: one that changes nothing writes, records
and sends nothing; one that moves a role onto or off keys through ``actors`` records
each key's role-changed activity and sends its ``key.updated`` event, in the same
transaction as the role's own record."""

from typing import Any

from keysvc.config import Settings
from tests.api.webhooks import create_webhook, deliveries, private_client
from tests.handsql import hand_value
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_ok,
    bootstrap,
    create_creds,
    create_role,
)
from tests.receiver import Receiver

EVENTS = ["key.created", "key.updated", "key.deleted"]


async def setup(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> tuple[Client, Creds, str]:
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    hook = await create_webhook(client, admin, {"url": receiver.url, "events": EVENTS})
    return client, admin, hook["webhook"]["id"]


async def activities(client: Client, admin: Creds) -> list[dict[str, Any]]:
    url = f"/v1/organizations/{admin.organization_id}/activities?limit=100&include=keysvc"
    result: list[dict[str, Any]] = await assert_ok(await client.get(url, headers=admin.headers))
    return result


async def sent(client: Client, admin: Creds, webhook_id: str, event: str) -> list[str]:
    """The IDs of the events of type ``event`` queued for the webhook."""
    return [
        d["eventId"] for d in await deliveries(client, admin, webhook_id) if d["eventType"] == event
    ]


def generation(settings: Settings) -> str:
    return str(hand_value(settings, "select value from meta where name = 'auth_generation'"))


async def test_a_key_patch_that_changes_nothing_sends_nothing(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, hook = await setup(aiohttp_client, settings, clock, receiver)
    key = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    url = f"/v1/organizations/{admin.organization_id}/keys/{key.id}"
    logged, gen = await activities(client, admin), generation(settings)
    response = await client.patch(url, json={"name": "svc"}, headers=admin.headers)
    assert (await assert_ok(response))["name"] == "svc"
    assert await sent(client, admin, hook, "key.updated") == []
    assert await activities(client, admin) == logged
    assert generation(settings) == gen
    # A real change is recorded and sent, as before.
    response = await client.patch(url, json={"name": "renamed"}, headers=admin.headers)
    assert (await assert_ok(response))["name"] == "renamed"
    assert len(await sent(client, admin, hook, "key.updated")) == 1
    assert (await activities(client, admin))[-1]["keyUpdateType"] == "name-changed"


async def test_a_role_patch_that_changes_nothing_writes_nothing(
    client: Client, admin: Creds, clock: FakeClock, settings: Settings
) -> None:
    role = await create_role(client, admin, {"name": "r", "permissions": ["reports:read"]})
    clock.advance(seconds=5)
    url = f"/v1/organizations/{admin.organization_id}/roles/{role['id']}"
    logged, gen = await activities(client, admin), generation(settings)
    for body in ({"name": "r"}, {"permissions": ["reports:read"]}, {"actors": []}):
        after = await assert_ok(await client.patch(url, json=body, headers=admin.headers))
        assert after == role
        assert await activities(client, admin) == logged
        assert generation(settings) == gen
    renamed = await assert_ok(await client.patch(url, json={"name": "s"}, headers=admin.headers))
    assert renamed["updatedAt"] != role["updatedAt"]
    assert [a["type"] for a in await activities(client, admin)] == [a["type"] for a in logged] + [
        "role_update"
    ]
    assert generation(settings) != gen


async def test_actors_record_and_send_each_moved_keys_change(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    client, admin, hook = await setup(aiohttp_client, settings, clock, receiver)
    one = await create_creds(client, admin, {"name": "one", "roles": ["developer"]})
    two = await create_creds(client, admin, {"name": "two", "roles": ["developer"]})
    body: dict[str, Any] = {
        "name": "r",
        "permissions": ["reports:read"],
        "actors": [f"apiKey/{one.id}"],
    }
    role = await create_role(client, admin, body)
    url = f"/v1/organizations/{admin.organization_id}/roles/{role['id']}"
    await assert_ok(
        await client.patch(url, json={"actors": [f"apiKey/{two.id}"]}, headers=admin.headers)
    )
    changes = [
        a
        for a in await activities(client, admin)
        if a["type"] == "openapi_key_update" and a["keyUpdateType"] == "role-changed"
    ]
    # one is given the role by its create, then relieved of it; two is given it.
    assert [(a["targetKeyId"], a["actorId"]) for a in changes] == [
        (one.id, admin.id),
        (one.id, admin.id),
        (two.id, admin.id),
    ]
    roles = [
        ([r["roleName"] for r in a["before"]["assignedRoles"]],
         [r["roleName"] for r in a["after"]["assignedRoles"]])
        for a in changes
    ]  # fmt: skip
    assert sorted(roles[0][1]) == ["developer", "r"]
    assert roles == [
        (["developer"], roles[0][1]),
        (roles[0][1], ["developer"]),
        (["developer"], roles[0][1]),
    ]
    assert len(await sent(client, admin, hook, "key.updated")) == 3
