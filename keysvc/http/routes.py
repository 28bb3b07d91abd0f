"""Every operation keysvc serves, declared once: its path and method, its operation ID,
the permission it needs or that it is public, its body and response schemas, and what
the OpenAPI document says of it.

The app registers each declared route's handler (``serves`` binds one), the
middleware lets a request to a public route through without credentials and checks
every other route's permission for the organization in its path before its view runs
(``keysvc.http.auth.guarded``), and ``keysvc.http.openapi`` documents the same
declarations: none keeps a table of its own (flask-smorest's habit, without the
framework).
"""

from keysvc.domain.limits import MAX_ROLE_IDS, MAX_USAGE_BUCKETS
from keysvc.http import queries as q
from keysvc.http import responses as r
from keysvc.http import role_schemas as rs
from keysvc.http import schemas as s
from keysvc.http.identity_routes import IDENTITY_ROUTES
from keysvc.http.import_routes import IMPORT_KEYS
from keysvc.http.keyfields import CreditsChangeSchema
from keysvc.http.routing import AUTHENTICATED as AUTHENTICATED
from keysvc.http.routing import DONE
from keysvc.http.routing import ORG as ORG
from keysvc.http.routing import WRITE as WRITE
from keysvc.http.routing import (
    Route as Route,
)
from keysvc.http.routing import (
    View as View,
)
from keysvc.http.routing import (
    handler_of as handler_of,
)
from keysvc.http.routing import (
    is_public as is_public,
)
from keysvc.http.routing import (
    path_uuid as path_uuid,
)
from keysvc.http.routing import (
    register as register,
)
from keysvc.http.routing import (
    route_of as route_of,
)
from keysvc.http.routing import (
    serves as serves,
)
from keysvc.http.webhook_routes import (
    CREATE_WEBHOOK,
    DELETE_WEBHOOK,
    GET_WEBHOOK,
    GITHUB_SCANNING,
    LIST_DELIVERIES,
    LIST_WEBHOOKS,
    RETRY_DELIVERY,
    REVOKE_LEAKED,
    ROTATE_WEBHOOK_SECRET,
    UPDATE_WEBHOOK,
)

KEYS_PATH, KEY_PATH = ORG + "/keys", ORG + "/keys/{keyId}"
USAGE_PATH = KEY_PATH + "/usage"
ROLES_PATH, ROLE_PATH = ORG + "/roles", ORG + "/roles/{roleId}"
ACTIVITIES_PATH, ACTIVITY_PATH = ORG + "/activities", ORG + "/activities/{activityId}"


_ROLES_LIST = (
    "Needs the permission `roles:read`. System roles first, then custom roles, each by name "
    "(code point order), in pages of `limit` (keysvc addition; upstream answers one list). "
    "An organization holds at most KEYSVC_MAX_ROLES_PER_ORG custom roles (default 1000)."
)
_ROLE_CREATE = (
    "Needs the permission `roles:write`. 409 when the organization already holds "
    "KEYSVC_MAX_ROLES_PER_ORG custom roles (default 1000), or when an actor already holds "
    f"{MAX_ROLE_IDS} roles."
)
_KEY, _ROLE, _DONE = "The key.", "The role.", DONE

LIST_KEYS = Route(
    "GET",
    KEYS_PATH,
    "openapiKeyGetList",
    "Get list of all keys, oldest first",
    permission="keys:read",
    response=r.ApiKeySchema,
    paged="keys",
    answer="Keys, each with the identityId of its identity when it has one (keysvc addition).",
    statuses=AUTHENTICATED,
)
CREATE_KEY = Route(
    "POST",
    KEYS_PATH,
    "openapiKeyCreate",
    "Create key",
    permission="keys:create",
    body=s.CreateKeySchema,
    response=r.CreateKeyResultSchema,
    answer="The key, and its credentials once.",
    statuses=(*WRITE, 409),
)
GET_KEY = Route(
    "GET",
    KEY_PATH,
    "openapiKeyGet",
    "Get key details",
    permission="keys:read",
    response=r.ApiKeySchema,
    answer=_KEY,
    statuses=(*AUTHENTICATED, 404),
)
UPDATE_KEY = Route(
    "PATCH",
    KEY_PATH,
    "openapiKeyUpdate",
    "Update key",
    permission="keys:update",
    body=s.PatchKeySchema,
    response=r.ApiKeySchema,
    answer=_KEY,
    statuses=(*WRITE, 404, 412),
    if_match=True,
)
DELETE_KEY = Route(
    "DELETE",
    KEY_PATH,
    "openapiKeyDelete",
    "Delete key (not the one making the request)",
    permission="keys:delete",
    answer=_DONE,
    statuses=(*WRITE, 404, 412),
    if_match=True,
)
_USAGE = (
    "Needs the permission `keys:read`. keysvc addition: the key's authentications, counted "
    "per minute by outcome, summed into buckets of a `granularity` (UTC) from `from` (rounded "
    "down) up to `to` (rounded up), every bucket answered, zeros included. Defaults: `to` "
    "now, `granularity` hour, `from` 24 hours before `to` (for `minute`: 1,440 minutes before "
    "`to` rounded up, the last 1,440 minutes), so every granularity works with none given. At most "
    f"{MAX_USAGE_BUCKETS} buckets (400 past it, or when `from` is after `to`). Counted: "
    "requests whose credentials were right, admitted (`success`) or refused (`disabled`, "
    "`expired`, `ipDenied`, `rateLimited`, or `forbidden`: any 403, whatever refused it; "
    "a 400, 404 or 409 of an admitted key is its `success`); unknown keys and wrong secrets are "
    "not. Counts appear once written, within KEYSVC_USAGE_FLUSH_SECONDS (default 10); rows "
    "older than KEYSVC_USAGE_RETENTION_DAYS (default 30) are pruned."
)
KEY_USAGE = Route(
    "GET",
    USAGE_PATH,
    "keysvcKeyUsage",
    "Authentications of a key over time (keysvc addition)",
    permission="keys:read",
    query=q.UsageQuerySchema,
    response=r.UsageSchema,
    answer="The key's usage series.",
    statuses=(*AUTHENTICATED, 404),
    description=_USAGE,
)
ROTATE_KEY = Route(
    "POST",
    KEY_PATH + "/rotate",
    "keysvcKeyRotate",
    "Rotate the key's credentials (keysvc addition)",
    permission="keys:update",
    body=s.RotateKeySchema,
    body_required=False,
    response=r.CreateKeyResultSchema,
    answer="The key, and its new credentials once.",
    statuses=(*WRITE, 404, 409),
    description=(
        "Needs the permission `keys:update`, and every permission the key holds. Gives the "
        "key a new key ID and secret (or those of `hashData`); its roles, IP access list, "
        "limits and name stay. The replaced credentials keep working for "
        "`gracePeriodSeconds` (default 0, at most 30 days), then fail as unknown ones do; "
        "the key's `previousCredentialExpiresAt` says when. A rotation during a grace "
        "period ends that grace at once. A key may rotate itself, with its current "
        "credentials only; rotating another key also needs `keys:create`, since its new "
        "credentials reach the caller. 409 for a disabled or expired key."
    ),
)
# Issue 29: a key's credits, changed without a race.
CHANGE_CREDITS = Route(
    "POST",
    KEY_PATH + "/credits",
    "keysvcKeyCredits",
    "Change the key's credits (keysvc addition)",
    permission="keys:update",
    body=CreditsChangeSchema,
    response=r.ApiKeySchema,
    answer=_KEY,
    statuses=(*WRITE, 404, 409),
    description=(
        "Needs the permission `keys:update`, and every permission the key holds; a key may "
        "not change its own credits. Exactly one of `set` (a number, or null for unlimited; "
        "the refill stays), `increment` or `decrement` (never below 0), applied in one "
        "transaction, with any refill due applied first: no spend in between is lost. "
        "Recorded as a `credits-changed` key update. 409 to increment or decrement "
        "unlimited credits."
    ),
)
LIST_ROLES = Route(
    "GET",
    ROLES_PATH,
    "organizationRolesGetList",
    "Get list of system and custom roles",
    tag="roles",
    permission="roles:read",
    response=r.RoleSchema,
    paged="roles",
    answer="Roles.",
    statuses=AUTHENTICATED,
    description=_ROLES_LIST,
)
CREATE_ROLE = Route(
    "POST",
    ROLES_PATH,
    "organizationRolePost",
    "Create a custom role",
    tag="roles",
    permission="roles:write",
    body=rs.CreateRoleSchema,
    response=r.RoleSchema,
    answer=_ROLE,
    statuses=(*WRITE, 409),
    description=_ROLE_CREATE,
)
GET_ROLE = Route(
    "GET",
    ROLE_PATH,
    "organizationRoleGet",
    "Get role details",
    tag="roles",
    permission="roles:read",
    response=r.RoleSchema,
    answer=_ROLE,
    statuses=(*AUTHENTICATED, 404),
)
UPDATE_ROLE = Route(
    "PATCH",
    ROLE_PATH,
    "organizationRolePatch",
    "Update a custom role",
    tag="roles",
    permission="roles:write",
    body=rs.UpdateRoleSchema,
    response=r.RoleSchema,
    answer=_ROLE,
    statuses=(*WRITE, 404, 409),
)
DELETE_ROLE = Route(
    "DELETE",
    ROLE_PATH,
    "organizationRoleDelete",
    "Delete a custom role no key holds",
    tag="roles",
    permission="roles:write",
    answer=_DONE,
    statuses=(*WRITE, 404, 409),
)
_ACTIVITIES = (
    "Needs the permission `activities:read`. Every key, role and webhook write, oldest "
    "first, in pages of `limit` (keysvc addition), created from `from_date` to `to_date` "
    "(both included; 400 when from_date is after to_date). Role and webhook events, "
    "key_used_after_revoke and the rate-limit-changed and key-rotated keyUpdateTypes are "
    "keysvc additions, listed only with `include=keysvc`; before, after and targetRoleId "
    "are additions too. The log is kept: there is no retention."
)
LIST_ACTIVITIES = Route(
    "GET",
    ACTIVITIES_PATH,
    "activityGetList",
    "List of organization activities",
    tag="activities",
    permission="activities:read",
    response=r.ActivitySchema,
    paged="activities",
    answer="Activities.",
    statuses=AUTHENTICATED,
    description=_ACTIVITIES,
)
GET_ACTIVITY = Route(
    "GET",
    ACTIVITY_PATH,
    "activityGet",
    "Organization activity",
    tag="activities",
    permission="activities:read",
    response=r.ActivitySchema,
    answer="The activity.",
    statuses=(*AUTHENTICATED, 404),
)
WHOAMI = Route(
    "GET",
    "/v1/whoami",
    "keysvcWhoAmI",
    "The calling key (keysvc addition)",
    tag="keysvc",
    response=r.WhoAmISchema,
    answer="The calling key.",
    statuses=(401, 403, 429, 500),
)
# Any method, documented as the three proxies use, each operation ID with its method.
VERIFY = Route(
    "*",
    "/v1/verify",
    "keysvcVerify",
    "Is this caller allowed? (forward auth; keysvc addition)",
    tag="keysvc",
    statuses=(400, 401, 403, 429, 500),
)
ROOT = Route(
    "GET",
    "/",
    "keysvcRoot",
    "Where to start: the console, the docs page and this document",
    tag="ops",
    public=True,
    statuses=(500,),
    fields=("console", "docs", "openapi"),
)
HEALTHZ = Route(
    "GET",
    "/healthz",
    "keysvcHealthz",
    "The process is alive",
    tag="ops",
    public=True,
    statuses=(500,),
    fields=("status",),
)
READYZ = Route(
    "GET",
    "/readyz",
    "keysvcReadyz",
    "The database answers",
    tag="ops",
    public=True,
    statuses=(500, 503),
    fields=("status",),
)
# Public to keys: with a metrics token set, the handler asks for it as a bearer token.
METRICS = Route(
    "GET",
    "/metrics",
    "keysvcMetrics",
    "Prometheus metrics (401 without the bearer token when KEYSVC_METRICS_TOKEN is set;"
    " 404 when KEYSVC_METRICS=off)",
    tag="ops",
    public=True,
    statuses=(401, 404, 500),
    media_type="text/plain",
)
OPENAPI_DOCUMENT = Route(
    "GET",
    "/v1/openapi.json",
    "keysvcOpenApi",
    "This document",
    tag="ops",
    public=True,
    statuses=(500,),
    media_type="application/json",
)
DOCS = Route(
    "GET",
    "/docs",
    "keysvcDocs",
    "This document, rendered",
    tag="ops",
    public=True,
    statuses=(500,),
    media_type="text/html",
)
DOCS_ASSET = Route(
    "GET", "/docs/assets/{name}", "keysvcDocsAsset", "An asset of the docs page", tag="ops",
    public=True, statuses=(404, 500), media_type="application/octet-stream",
)  # fmt: skip
# The console calls the public API above with the key signed in; it has no operation
# of its own, and its page and files need no credentials.
CONSOLE = Route(
    "GET",
    "/console",
    "keysvcConsole",
    "The management console: a web page that calls this API",
    tag="ops",
    public=True,
    statuses=(500,),
    media_type="text/html",
)
CONSOLE_ASSET = Route(
    "GET", "/console/assets/{version}/{name}", "keysvcConsoleAsset",
    "A file of the console, at the version the page names", tag="ops", public=True,
    statuses=(404, 500), media_type="application/octet-stream",
)  # fmt: skip

# In the document's order; the routes of one path next to each other.
ROUTES: tuple[Route, ...] = (
    LIST_KEYS, CREATE_KEY, GET_KEY, UPDATE_KEY, DELETE_KEY, ROTATE_KEY, KEY_USAGE,
    CHANGE_CREDITS, IMPORT_KEYS,
    LIST_ROLES, CREATE_ROLE, GET_ROLE, UPDATE_ROLE, DELETE_ROLE,
    LIST_ACTIVITIES, GET_ACTIVITY,
    *IDENTITY_ROUTES,
    LIST_WEBHOOKS, CREATE_WEBHOOK, GET_WEBHOOK, UPDATE_WEBHOOK, DELETE_WEBHOOK,
    LIST_DELIVERIES, RETRY_DELIVERY, ROTATE_WEBHOOK_SECRET,
    REVOKE_LEAKED, GITHUB_SCANNING,
    WHOAMI, VERIFY, ROOT, HEALTHZ, READYZ, METRICS, OPENAPI_DOCUMENT, DOCS, DOCS_ASSET,
    CONSOLE, CONSOLE_ASSET,
)  # fmt: skip
