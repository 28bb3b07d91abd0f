"""The OpenAPI document's ``webhooks`` (OpenAPI 3.1): what keysvc POSTs to a webhook's
URL, the event and the headers that sign it (``keysvc.domain.signing``)."""

from typing import Any

from keysvc.http.schemas import EVENT_TYPES

_DELIVERY_HEADERS = {
    "webhook-id": "Standard Webhooks: the event's ID, the same on every attempt of it.",
    "webhook-timestamp": "Standard Webhooks: unix seconds of this attempt.",
    "webhook-signature": "Standard Webhooks: `v1,<base64 HMAC-SHA256>` of"
    " `<webhook-id>.<webhook-timestamp>.<body>`, keyed with the webhook secret's bytes (what"
    " follows `whsec_`, base64-decoded); during a secret rotation's overlap a second"
    " `v1,<base64>`, the previous secret's, follows, space-separated.",
    "Keysvc-Event-Id": "The event's ID.",
    "Keysvc-Event-Type": "The event's type.",
    "Keysvc-Signature": "`t=<unix seconds>,v1=<hex>,v2=<hex>`: v2 is HMAC-SHA256 keyed with"
    " the secret's text of `<t>.<event ID>.<event type>.<body>`; during a rotation's overlap"
    " the previous secret's v1 and v2 follow.",
}

_DATA = (
    "The event's object: a key's events carry the key's view. `key.leaked` adds"
    " `leakedSecret`: `credential` (`current` or `previous`: which of the key's secrets"
    " was reported), and for a previous secret a rotation replaced, which no longer"
    " opens the key and is never disabled for, `replacedAt` (when it stopped opening"
    " the key) and `keyLeftEnabled` (true when the key stays enabled: rotate or disable"
    " it yourself)."
)


def delivery_webhooks() -> dict[str, Any]:
    """What keysvc POSTs to a webhook (OpenAPI 3.1's ``webhooks``): the event and the
    headers that sign it (``keysvc.domain.signing``)."""
    return {
        "keysvcEvent": {
            "post": {
                "operationId": "keysvcEventDelivery",
                "summary": "An event, POSTed to a webhook's URL (keysvc addition)",
                "description": "Signed twice: Standard Webhooks' headers, which any of its"
                " libraries verifies with the webhook's whsec_ secret, and Keysvc-Signature."
                " Any 2xx is delivered; anything else is retried.",
                "tags": ["webhooks"],
                "security": [],
                "parameters": [
                    {
                        "in": "header",
                        "name": name,
                        "required": True,
                        "description": text,
                        "schema": {"type": "string"},
                    }
                    for name, text in _DELIVERY_HEADERS.items()
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": [
                                    "id",
                                    "type",
                                    "createdAt",
                                    "organizationId",
                                    "data",
                                ],
                                "properties": {
                                    "id": {"type": "string", "format": "uuid"},
                                    "type": {"type": "string", "enum": list(EVENT_TYPES)},
                                    "createdAt": {"type": "string", "format": "date-time"},
                                    "organizationId": {"type": "string"},
                                    "data": {
                                        "type": "object",
                                        "description": _DATA,
                                    },
                                },
                            }
                        }
                    },
                },
                "responses": {"2XX": {"description": "Delivered."}},
            }
        }
    }
