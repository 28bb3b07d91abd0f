"""The routes of webhooks and of leak reports, declared as ``keysvc.http.routes``
declares the others (moved out of it to keep each module small); ``routes.ROUTES``
lists them in the document's order."""

from keysvc.domain.limits import MAX_WEBHOOK_URL, MAX_WEBHOOKS_PER_ORG
from keysvc.http import responses as r
from keysvc.http import schemas as s
from keysvc.http import webhook_schemas as ws
from keysvc.http.reports import RevokeLeakedSchema
from keysvc.http.routing import AUTHENTICATED, DONE, ORG, WRITE, Route

WEBHOOKS_PATH, WEBHOOK_PATH = ORG + "/webhooks", ORG + "/webhooks/{webhookId}"
DELIVERIES_PATH = WEBHOOK_PATH + "/deliveries"
ROTATE_SECRET_PATH = WEBHOOK_PATH + "/rotate-secret"
RETRY_PATH = DELIVERIES_PATH + "/{deliveryId}/retry"

_WEBHOOK = "The webhook."
_WEBHOOK_CREATE = (
    "Needs the permission `webhooks:write`, and `keys:read` to subscribe to key events "
    "(every event type is one: their data is a key's view). keysvc addition. The URL is "
    f"http(s), without credentials, at most {MAX_WEBHOOK_URL} characters, and its host "
    "must be public (not "
    "loopback, private, link-local, multicast, reserved or unspecified) unless "
    f"KEYSVC_WEBHOOK_ALLOW_PRIVATE=1. 409 when the organization already holds "
    f"{MAX_WEBHOOKS_PER_ORG} webhooks. The signing secret is in this answer only."
)
_DELIVERIES = (
    "Needs the permission `webhooks:read`. keysvc addition. Newest first, in pages of `limit`: "
    "each delivery of an event to this webhook, its attempts (time, HTTP status or error "
    "class), its next attempt and its state (pending, delivered, or failed once a day has "
    "passed without a 2xx)."
)
LIST_WEBHOOKS = Route(
    "GET",
    WEBHOOKS_PATH,
    "keysvcWebhookList",
    "Get the organization's webhooks, oldest first (keysvc addition)",
    tag="webhooks",
    permission="webhooks:read",
    response=r.WebhookSchema,
    many=True,
    answer="Webhooks.",
    statuses=AUTHENTICATED,
)
CREATE_WEBHOOK = Route(
    "POST",
    WEBHOOKS_PATH,
    "keysvcWebhookCreate",
    "Create a webhook (keysvc addition)",
    tag="webhooks",
    permission="webhooks:write",
    body=s.CreateWebhookSchema,
    response=r.CreateWebhookResultSchema,
    answer="The webhook, and its signing secret once.",
    statuses=(*WRITE, 409),
    description=_WEBHOOK_CREATE,
)
GET_WEBHOOK = Route(
    "GET",
    WEBHOOK_PATH,
    "keysvcWebhookGet",
    "Get webhook details (keysvc addition)",
    tag="webhooks",
    permission="webhooks:read",
    response=r.WebhookSchema,
    answer=_WEBHOOK,
    statuses=(*AUTHENTICATED, 404),
)
DELETE_WEBHOOK = Route(
    "DELETE",
    WEBHOOK_PATH,
    "keysvcWebhookDelete",
    "Delete a webhook and its pending deliveries (keysvc addition)",
    tag="webhooks",
    permission="webhooks:write",
    answer=DONE,
    statuses=(*WRITE, 404),
)
LIST_DELIVERIES = Route(
    "GET",
    DELIVERIES_PATH,
    "keysvcWebhookDeliveries",
    "Get a webhook's deliveries and their attempts, newest first (keysvc addition)",
    tag="webhooks",
    permission="webhooks:read",
    response=r.DeliverySchema,
    paged="deliveries",
    answer="Deliveries.",
    statuses=(*AUTHENTICATED, 404),
    description=_DELIVERIES,
)
REVOKE_LEAKED = Route(
    "POST",
    "/v1/keys/revoke-leaked",
    "keysvcRevokeLeaked",
    "Report a key's leaked secret: the key is disabled (keysvc addition)",
    tag="keys",
    public=True,
    body=RevokeLeakedSchema,
    answer="The report was received. The same answer whether or not the secret was a key's.",
    statuses=(400, 429, 500, 503),
    fields=("status",),
    description=(
        "Public: holding the secret (surrounding whitespace trimmed) is the authority. The "
        "key whose current secret it is, or whose previous secret within a rotation's "
        "grace, is disabled (with KEYSVC_LEAKED_KEY_ACTION=notify it is left enabled), a "
        "`key_leaked` activity records the report, and the `key.leaked` event is sent, in "
        "one transaction, just after the answer. The answer, its headers and its time are "
        "the same whether or not the secret was a key's, and each report counts as a "
        "failed login of its client network: 429 past KEYSVC_AUTH_FAILURES a minute; 503 "
        "with Retry-After while 1,000 reports wait for their work. A secret reported again "
        "changes nothing. A report is a revocation: never refused for its organization's "
        "write budget or a webhook's full queue."
    ),
)
GITHUB_SCANNING = Route(
    "POST",
    "/v1/secret-scanning/github",
    "keysvcGithubSecretScanning",
    "GitHub secret scanning's reports of leaked secrets (keysvc addition)",
    tag="keys",
    public=True,
    answer="GitHub's feedback: one label per token reported.",
    statuses=(400, 403, 404, 413, 415, 429, 500, 503),
    description=(
        "Public, off unless KEYSVC_GITHUB_SCANNING_KEYS names a file of GitHub's secret "
        "scanning public keys (then 404, as for an unknown path). Each request is verified "
        "before anything else: an ECDSA P-256 / SHA-256 signature over the raw body as "
        "sent (a report with a Content-Encoding is a 415: GitHub sends none), "
        "base64 DER in `Github-Public-Key-Signature`, with the key "
        "`Github-Public-Key-Identifier` names; a missing or unknown identifier or a bad "
        "signature is a 403 that changes nothing and counts as a failed login of its "
        "client network. The body is GitHub's array of `{token, type, url, source}` (1 to "
        "100 tokens; a body that is not is a 400). Each token that is a key's secret "
        "(current, or previous within a rotation's grace) is acted on as "
        "`POST /v1/keys/revoke-leaked` does, its `key_leaked` activity keeping the "
        "report's `url`, `source` and `type`. **Not the envelope**: a 200 answers GitHub's "
        "feedback format, an array of `{token_hash, token_type, label}`, `token_hash` the "
        "SHA-256 hex of the token (never the token), `label` `true_positive` for a key's "
        "secret and `false_positive` otherwise, including a look-alike with a valid "
        "checksum; the requestId is in the `X-Request-Id` header. Errors are envelopes. "
        "Each token is acted on alone; when one cannot be (the database failing), the "
        "others are, and the answer is a 503 naming nothing, for GitHub to send again."
    ),
)
ROTATE_WEBHOOK_SECRET = Route(
    "POST",
    ROTATE_SECRET_PATH,
    "keysvcWebhookRotateSecret",
    "Rotate a webhook's signing secret (keysvc addition)",
    tag="webhooks",
    permission="webhooks:write",
    body=ws.RotateWebhookSecretSchema,
    body_required=False,
    response=r.RotateWebhookSecretResultSchema,
    answer="The webhook, and its new signing secret once.",
    statuses=(*WRITE, 404),
    description=(
        "Needs the permission `webhooks:write`. keysvc addition. Gives the webhook a new "
        "signing secret, shown in this answer only; for `overlapSeconds` (default a day, at "
        "most 7 days; 0: none) every delivery is signed with both, the new first "
        "(`webhook-signature: v1,<new> v1,<old>`, and a second v1 and v2 in "
        "`Keysvc-Signature`), so that receivers can move to the new one. A rotation during "
        "an overlap ends the older secret's at once. Recorded as a `webhook_secret_rotate` "
        "activity."
    ),
)
UPDATE_WEBHOOK = Route(
    "PATCH",
    WEBHOOK_PATH,
    "keysvcWebhookUpdate",
    "Enable or disable a webhook (keysvc addition)",
    tag="webhooks",
    permission="webhooks:write",
    body=ws.UpdateWebhookSchema,
    response=r.WebhookSchema,
    answer=_WEBHOOK,
    statuses=(*WRITE, 404),
    description=(
        "Needs the permission `webhooks:write`. keysvc addition. `enabled: false` disables "
        "the webhook: it is sent no event, and its pending deliveries wait. `enabled: true` "
        "enables it again and resets its failure clock: keysvc disables a webhook that has "
        "failed every attempt for KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS (120, five days), and "
        "sends its organization's other webhooks `webhook.disabled`. A change is recorded "
        "as a `webhook_update` activity."
    ),
)
RETRY_DELIVERY = Route(
    "POST",
    RETRY_PATH,
    "keysvcWebhookDeliveryRetry",
    "Attempt a delivery again now (keysvc addition)",
    tag="webhooks",
    permission="webhooks:write",
    response=r.DeliverySchema,
    answer="The delivery, pending.",
    statuses=(*WRITE, 404, 409),
    description=(
        "Needs the permission `webhooks:write`. keysvc addition. The delivery (its event, "
        "body and `webhook-id` as before, newly signed) is attempted again at once: one "
        "attempt more for a delivered or failed one, while a pending one keeps its "
        "retries (one being attempted right now is left to that attempt). 404 when the "
        "webhook, or this delivery of it, is not in this organization; 409 while the "
        "webhook is disabled."
    ),
)
