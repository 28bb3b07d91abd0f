"""A webhook's create and delete are in the activity log, through the real app: who
did it, the webhook's ID, URL, events and expiringDays, never its secret; a key that
holds only the webhook permissions leaves a trace when it deletes the admin's
webhook; and ``keysvc audit verify`` still holds on such a log."""

from keysvc.config import Settings
from tests.api.webhooks import create_webhook, every_activity, hooks_url
from tests.handsql import audit_verdict
from tests.helpers import Client, Creds, assert_ok, create_creds, create_role

URL = "http://93.184.215.14/hooks"  # a public literal: nothing to resolve


async def test_a_webhook_s_create_and_delete_are_recorded_without_its_secret(
    client: Client, admin: Creds, settings: Settings
) -> None:
    role = await create_role(
        client, admin, {"name": "hooks", "permissions": ["webhooks:write", "webhooks:read"]}
    )
    hooker = await create_creds(client, admin, {"name": "h", "assignedRoleIds": [role["id"]]})
    body = {"url": URL, "events": ["key.created", "key.deleted"], "expiringDays": 3}
    created = await create_webhook(client, admin, body)
    webhook_id, secret = created["webhook"]["id"], created["secret"]
    response = await client.delete(hooks_url(admin, webhook_id), headers=hooker.headers)
    await assert_ok(response)

    log = await every_activity(client, admin)
    view = {"webhookId": webhook_id, "url": URL, "events": ["key.created", "key.deleted"],
            "expiringDays": 3}  # fmt: skip
    (made,) = [a for a in log if a["type"] == "webhook_create"]
    assert (made["actorId"], made["after"]) == (admin.id, view)
    assert "before" not in made and "targetKeyId" not in made
    (gone,) = [a for a in log if a["type"] == "webhook_delete"]
    assert (gone["actorId"], gone["before"]) == (hooker.id, view)
    assert "after" not in gone
    assert secret not in repr(log) and secret.removeprefix("whsec_") not in repr(log)
    assert "nonce" not in repr(log).lower()
    assert audit_verdict(settings).problem is None


async def test_a_refused_delete_records_nothing(client: Client, admin: Creds) -> None:
    missing = "00000000-0000-4000-8000-000000000000"
    response = await client.delete(hooks_url(admin, missing), headers=admin.headers)
    assert response.status == 404
    assert not [a for a in await every_activity(client, admin) if a["type"].startswith("webhook")]
