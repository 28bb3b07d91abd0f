"""Webhook subscriptions through the real app: create (the secret shown once), list,
read and delete; the body's bounds; the URL rules against server-side request forgery;
the per-organization limit; permissions and organizations kept apart; answers as the
OpenAPI document describes them."""

from typing import Any

import pytest
from aiohttp import ClientResponse
from jsonschema import Draft202012Validator

from keysvc.config import Settings
from tests.api.webhooks import (
    ALL_EVENTS,
    PRIVATE,
    attempted,
    create_webhook,
    hooks_url,
    private_client,
)
from tests.handsql import everything_stored
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    create,
    create_creds,
)
from tests.receiver import Receiver

MAX_WEBHOOKS_PER_ORG = 20  # as docs/concepts/events.md and the OpenAPI document say
PUBLIC = "https://93.184.215.14/hooks"  # a public address: no name to resolve


async def test_create_shows_the_secret_once_then_list_get_delete(
    client: Client, admin: Creds, settings: Settings
) -> None:
    created = await create_webhook(client, admin, {"url": PUBLIC, "events": ALL_EVENTS})
    webhook, secret = created["webhook"], created["secret"]
    assert set(created) == {"webhook", "secret"}
    assert secret.startswith("whsec_") and len(secret) > 40
    assert webhook["url"] == PUBLIC
    assert webhook["events"] == ALL_EVENTS
    assert webhook["expiringDays"] == 7
    assert set(webhook) == {
        "id", "url", "events", "expiringDays", "createdAt", "enabled", "disabledAt",
        "failingSince", "previousSecretExpiresAt",
    }  # fmt: skip
    assert webhook["enabled"] is True and webhook["disabledAt"] is None
    assert webhook["failingSince"] is None  # nothing attempted yet
    assert webhook["previousSecretExpiresAt"] is None  # never rotated

    listed = await assert_ok(await client.get(hooks_url(admin), headers=admin.headers))
    assert listed == [webhook]
    got = await assert_ok(await client.get(hooks_url(admin, webhook["id"]), headers=admin.headers))
    assert got == webhook
    # Neither the list nor the read shows the secret again, and the database holds it nowhere.
    assert secret not in str(listed) + str(got)
    assert secret.encode() not in everything_stored(settings)

    response = await client.delete(hooks_url(admin, webhook["id"]), headers=admin.headers)
    assert await assert_ok(response) is None
    response = await client.get(hooks_url(admin, webhook["id"]), headers=admin.headers)
    await assert_error(response, 404, "webhook not found in this organization")
    response = await client.delete(hooks_url(admin, webhook["id"]), headers=admin.headers)
    await assert_error(response, 404, "webhook not found in this organization")
    assert await assert_ok(await client.get(hooks_url(admin), headers=admin.headers)) == []


async def test_two_webhooks_have_different_secrets(client: Client, admin: Creds) -> None:
    body = {"url": PUBLIC, "events": ["key.created"], "expiringDays": 30}
    first = await create_webhook(client, admin, body)
    second = await create_webhook(client, admin, body)
    assert first["secret"] != second["secret"]
    assert first["webhook"]["expiringDays"] == 30


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"events": ["key.created"]}, "url: is required"),
        ({"url": PUBLIC}, "events: is required"),
        ({"url": PUBLIC, "events": []}, "events: must name 1 to 12 event types, each once"),
        (
            {"url": PUBLIC, "events": ["key.created", "key.created"]},
            "events: must name each event type once",
        ),
        (
            {"url": PUBLIC, "events": ["key.exploded"]},
            "events.0: must be one of: key.created, key.updated, key.deleted, key.rotated,"
            " key.expiring, key.used_after_revoke, key.leaked, webhook.disabled,"
            " key.credits_low, key.credits_exhausted, identity.credits_low,"
            " identity.credits_exhausted",
        ),
        (
            {"url": PUBLIC, "events": ["key.expiring"], "expiringDays": 0},
            "expiringDays: must be an integer from 1 to 90",
        ),
        (
            {"url": PUBLIC, "events": ["key.expiring"], "expiringDays": 91},
            "expiringDays: must be an integer from 1 to 90",
        ),
        (
            {"url": "https://example.com/" + "a" * 2048, "events": ["key.created"]},
            "url: must be 1 to 2048 characters, such as https://example.com/hooks",
        ),
        ({"url": PUBLIC, "events": ["key.created"], "secret": "x"}, "secret: is not a known field"),
        ({"url": "ftp://93.184.215.14/x", "events": ["key.created"]},
         "url: must start with https:// or http://"),
        ({"url": "file:///etc/passwd", "events": ["key.created"]},
         "url: must start with https:// or http://"),
        ({"url": "not a url", "events": ["key.created"]}, "url: must start with https:// or http://"),
        ({"url": "https://user:pw@93.184.215.14/", "events": ["key.created"]},
         "url: must not carry a user name or password"),
        ({"url": "https:///nohost", "events": ["key.created"]},
         "url: has no host; give one such as https://example.com/hooks"),
    ],
)  # fmt: skip
async def test_bad_bodies_are_refused(
    client: Client, admin: Creds, body: dict[str, object], message: str
) -> None:
    response = await client.post(hooks_url(admin), json=body, headers=admin.headers)
    await assert_error(response, 400, message)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://127.0.0.1:8080/x", "127.0.0.1"),
        ("http://127.1.2.3/x", "127.1.2.3"),
        ("http://localhost/x", "localhost"),
        ("http://10.0.0.5/x", "10.0.0.5"),
        ("http://172.16.0.1/x", "172.16.0.1"),
        ("http://192.168.1.1/x", "192.168.1.1"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254"),
        ("http://0.0.0.0/x", "0.0.0.0"),
        ("http://224.0.0.1/x", "224.0.0.1"),
        ("http://240.0.0.1/x", "240.0.0.1"),
        ("http://100.64.0.1/x", "100.64.0.1"),
        ("http://[::1]/x", "::1"),
        ("http://[::]/x", "::"),
        ("http://[fe80::1]/x", "fe80::1"),
        ("http://[fc00::1]/x", "fc00::1"),
        ("http://[ff02::1]/x", "ff02::1"),
        ("http://[::ffff:127.0.0.1]/x", "::ffff:7f00:1"),
        ("http://[::ffff:10.0.0.1]/x", "::ffff:a00:1"),
    ],
)
async def test_private_targets_are_refused(
    client: Client, admin: Creds, url: str, host: str
) -> None:
    response = await client.post(
        hooks_url(admin), json={"url": url, "events": ["key.created"]}, headers=admin.headers
    )
    await assert_error(response, 400, PRIVATE.format(host))


async def test_a_host_that_does_not_resolve_is_refused(client: Client, admin: Creds) -> None:
    body = {"url": "https://no-such-host.invalid/hooks", "events": ["key.created"]}
    response = await client.post(hooks_url(admin), json=body, headers=admin.headers)
    await assert_error(response, 400, "url: the host no-such-host.invalid does not resolve")


async def test_an_organization_holds_a_bounded_number(client: Client, admin: Creds) -> None:
    body = {"url": PUBLIC, "events": ["key.created"]}
    for _ in range(MAX_WEBHOOKS_PER_ORG):
        await create_webhook(client, admin, body)
    response = await client.post(hooks_url(admin), json=body, headers=admin.headers)
    await assert_error(
        response,
        409,
        f"this organization has reached its limit of {MAX_WEBHOOKS_PER_ORG} webhooks;"
        " delete one first",
    )


async def test_permissions_and_organizations(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    created = await create_webhook(client, admin, {"url": PUBLIC, "events": ["key.created"]})
    webhook_id = created["webhook"]["id"]
    developer = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    body = {"url": PUBLIC, "events": ["key.created"]}
    for method, url, json in (
        ("GET", hooks_url(admin), None),
        ("POST", hooks_url(admin), body),
        ("GET", hooks_url(admin, webhook_id), None),
        ("DELETE", hooks_url(admin, webhook_id), None),
        ("GET", hooks_url(admin, webhook_id, "/deliveries"), None),
    ):
        response = await client.request(method, url, json=json, headers=developer.headers)
        needed = "webhooks:write" if method in ("POST", "DELETE") else "webhooks:read"
        await assert_error(response, 403, f"this key lacks the permission {needed}")
        # Another organization's admin sees nothing of it.
        response = await client.request(method, url, json=json, headers=other_admin.headers)
        assert response.status == 403
    response = await client.get(hooks_url(other_admin, webhook_id), headers=other_admin.headers)
    await assert_error(response, 404, "webhook not found in this organization")
    assert (
        await assert_ok(await client.get(hooks_url(other_admin), headers=other_admin.headers)) == []
    )


async def test_answers_match_the_document(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock, receiver: Receiver
) -> None:
    """Each webhook operation's answers, a delivery log with an attempt included, validate
    against the OpenAPI document the app serves (schemathesis leaves webhooks out)."""
    client = await private_client(aiohttp_client, settings, clock)
    admin = await bootstrap(client.app)
    document = await (await client.get("/v1/openapi.json")).json()

    async def check(path: str, method: str, status: int, response: ClientResponse) -> Any:
        assert response.status == status
        body = await response.json()
        content = document["paths"][path][method]["responses"][str(status)]["content"]
        schema = {**content["application/json"]["schema"], "components": document["components"]}
        errors = list(Draft202012Validator(schema).iter_errors(body))
        assert not errors, f"{method} {path} {status}: {errors[0].message}"
        return body

    h, hooks = admin.headers, "/v1/organizations/{organizationId}/webhooks"
    one, log = hooks + "/{webhookId}", hooks + "/{webhookId}/deliveries"
    body = {"url": receiver.url, "events": ["key.created"]}
    made = await check(
        hooks, "post", 200, await client.post(hooks_url(admin), json=body, headers=h)
    )
    webhook_id = made["result"]["webhook"]["id"]
    await create(client, admin, {"name": "x", "roles": ["developer"]})
    await receiver.wait_for(lambda got: len(got) >= 1)
    await check(hooks, "get", 200, await client.get(hooks_url(admin), headers=h))
    await check(one, "get", 200, await client.get(hooks_url(admin, webhook_id), headers=h))
    await attempted(client, admin, webhook_id)
    url = hooks_url(admin, webhook_id, "/deliveries")
    page = await check(log, "get", 200, await client.get(url, headers=h))
    assert page["result"][0]["attemptCount"] == 1
    bad = {"url": "ftp://x", "events": ["key.created"]}
    await check(hooks, "post", 400, await client.post(hooks_url(admin), json=bad, headers=h))
    await check(one, "delete", 200, await client.delete(hooks_url(admin, webhook_id), headers=h))
    await check(one, "get", 404, await client.get(hooks_url(admin, webhook_id), headers=h))
    await check(log, "get", 404, await client.get(url, headers=h))
