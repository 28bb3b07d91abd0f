"""Webhook views: an organization's webhooks (create, list, read, enable or disable,
delete, rotate the secret) and each one's delivery log (list, retry one)."""

from aiohttp import web

from keysvc.domain import webhooks
from keysvc.http.envelope import ok
from keysvc.http.queries import ListDeliveriesQuerySchema
from keysvc.http.responses import (
    CreateWebhookResultSchema,
    DeliverySchema,
    RotateWebhookSecretResultSchema,
    WebhookSchema,
)
from keysvc.http.routes import serves
from keysvc.http.schemas import CreateWebhookSchema, load
from keysvc.http.state import CLOCK, HASHER, SETTINGS, STORE
from keysvc.http.views.common import (
    actor,
    authorized,
    path_uuid,
    query,
    read_json_object,
    read_optional_json_object,
)
from keysvc.http.webhook_routes import (
    CREATE_WEBHOOK,
    DELETE_WEBHOOK,
    GET_WEBHOOK,
    LIST_DELIVERIES,
    LIST_WEBHOOKS,
    RETRY_DELIVERY,
    ROTATE_WEBHOOK_SECRET,
    UPDATE_WEBHOOK,
)
from keysvc.http.webhook_schemas import RotateWebhookSecretSchema, UpdateWebhookSchema

_webhook = WebhookSchema()
_webhooks = WebhookSchema(many=True)
_created = CreateWebhookResultSchema()
_deliveries = DeliverySchema(many=True)
_create = CreateWebhookSchema()
_deliveries_query = ListDeliveriesQuerySchema()
_rotate = RotateWebhookSecretSchema()
_update = UpdateWebhookSchema()
_delivery = DeliverySchema()
_rotated = RotateWebhookSecretResultSchema()


@serves(LIST_WEBHOOKS)
async def list_webhooks(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    return ok(
        request, _webhooks.dump(await webhooks.list_webhooks(request.app[STORE], organization_id))
    )


@serves(CREATE_WEBHOOK)
async def create_webhook(request: web.Request) -> web.Response:
    caller, organization_id = authorized(request)
    data = load(_create, await read_json_object(request))
    app = request.app
    created = await webhooks.create_webhook(
        app[STORE], app[HASHER], caller, organization_id, data, app[CLOCK](),
        app[SETTINGS].webhook_allow_private, actor(request),
    )  # fmt: skip
    return ok(request, _created.dump(created))


@serves(GET_WEBHOOK)
async def get_webhook(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    webhook_id = path_uuid(request, "webhookId")
    return ok(
        request,
        _webhook.dump(await webhooks.get_webhook(request.app[STORE], organization_id, webhook_id)),
    )


@serves(DELETE_WEBHOOK)
async def delete_webhook(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    await webhooks.delete_webhook(
        request.app[STORE], organization_id, path_uuid(request, "webhookId"), actor(request),
        request.app[CLOCK](),
    )  # fmt: skip
    return ok(request)


@serves(LIST_DELIVERIES)
async def list_deliveries(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    webhook_id = path_uuid(request, "webhookId")
    params = load(_deliveries_query, query(request))
    page, cursor = await webhooks.deliveries(
        request.app[STORE], request.app[HASHER], organization_id, webhook_id,
        params.get("cursor"), params["limit"],
    )  # fmt: skip
    return ok(request, _deliveries.dump(page.deliveries), nextCursor=cursor, totalCount=page.total)


@serves(ROTATE_WEBHOOK_SECRET)
async def rotate_secret(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    webhook_id = path_uuid(request, "webhookId")
    data = load(_rotate, await read_optional_json_object(request))
    rotated = await webhooks.rotate_secret(
        request.app[STORE], request.app[HASHER], organization_id, webhook_id,
        data["overlapSeconds"], actor(request), request.app[CLOCK](),
    )  # fmt: skip
    return ok(request, _rotated.dump(rotated))


@serves(UPDATE_WEBHOOK)
async def update_webhook(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    webhook_id = path_uuid(request, "webhookId")
    data = load(_update, await read_json_object(request))
    webhook = await webhooks.set_enabled(
        request.app[STORE], organization_id, webhook_id, data["enabled"], actor(request),
        request.app[CLOCK](),
    )  # fmt: skip
    return ok(request, _webhook.dump(webhook))


@serves(RETRY_DELIVERY)
async def retry_delivery(request: web.Request) -> web.Response:
    _, organization_id = authorized(request)
    webhook_id = path_uuid(request, "webhookId")
    delivery_id = path_uuid(request, "deliveryId")
    delivery = await webhooks.retry_delivery(
        request.app[STORE], organization_id, webhook_id, delivery_id, actor(request),
        request.app[CLOCK](),
    )  # fmt: skip
    return ok(request, _delivery.dump(delivery))
