"""The OpenAPI 3.1 document, generated from the marshmallow schemas by apispec.

Components and operations carry the upstream names and operationIds, so a client
generated from either document works against keysvc; what keysvc adds is marked
``x-keysvc-addition``. Every operation lists every status it can answer, with the
error envelope. Request schemas say in JSON Schema what the validators check, so a
body the document allows is one keysvc accepts and the other way round; what JSON
Schema cannot say (expireAt in the future, IDs that must exist) is in the
descriptions. One difference: ``expireAt`` is ``date-time`` here, and keysvc also
accepts the other ISO-8601 forms ``datetime.fromisoformat`` reads. Responses carry
links from each create to the operations on what it created.
"""

import json
import re
from datetime import UTC, datetime
from functools import cache
from typing import Any

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from marshmallow import Schema

from keysvc import __version__
from keysvc.domain.permquery import MAX_DEPTH, MAX_QUERY_LENGTH, MAX_TERMS, QUERY_PATTERN
from keysvc.http import identity_schemas as ids
from keysvc.http import import_schemas as im
from keysvc.http import queries as q
from keysvc.http import reports
from keysvc.http import responses as r
from keysvc.http import role_schemas as rs
from keysvc.http import schemas as s
from keysvc.http import webhook_schemas as ws
from keysvc.http.keyfields import EXTERNAL_ID_PARAM, CreditsChangeSchema
from keysvc.http.openapi_rules import NAME_RULE, QUERY_RULE, UUID_TEXT, tighten
from keysvc.http.openapi_webhooks import delivery_webhooks
from keysvc.http.render import MAX_PERMISSIONS_HEADER
from keysvc.http.reuse import REUSE_HEADERS_DOCUMENTED
from keysvc.http.routes import (
    KEY_PATH,
    KEYS_PATH,
    LIST_ACTIVITIES,
    LIST_KEYS,
    ROLE_PATH,
    ROLES_PATH,
    ROUTES,
    Route,
)
from keysvc.http.verifydoc import VERIFY_HEADERS, VERIFY_JSON, VERIFY_PARAMS
from keysvc.http.webhook_routes import GITHUB_SCANNING, WEBHOOK_PATH, WEBHOOKS_PATH
from keysvc.timeutil import utcnow

_ERRORS = {
    400: "The request cannot be processed due to a client error: `error` names the field and why.",
    401: "Missing, malformed, unknown or wrong credentials (one message for all), or a key "
    "that is disabled or expired.",
    403: "The key may not do this: another organization, a missing permission, a grant beyond "
    "its own, or a client address outside its IP access list.",
    404: "No such object in this organization.",
    409: "The request clashes with existing state.",
    412: "If-Match does not match the key's current ETag.",
    429: "Over a rate limit: the key's requests per window, or failed authentications from "
    "this client address. Retry-After and X-RateLimit-Reset say when to come back.",
    413: "The body is larger than 64 KiB.",
    415: "The body is not `application/json`.",
    500: "An internal server error has occurred; the server log has it under the requestId.",
    503: "Not ready: the database does not answer, its schema is not current, or its disk is full.",
    507: "The database's disk is full: nothing was written. Reads still work; retry later.",
}
_WITH_BODY = (413, 415)


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _envelope(result: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "status": {"type": "number", "description": "HTTP status code.", "example": 200},
        "requestId": {
            "type": "string",
            "format": "uuid",
            "description": "Unique id assigned to every request. UUIDv4",
        },
    }
    if result is not None:
        properties["result"] = result
    properties.update(extra)
    return {"type": "object", "properties": properties, "required": ["status", "requestId"]}


_HEADERS = {"X-Request-Id": {"description": "The requestId", "schema": {"type": "string"}}}
_RATE_HEADERS = {
    "X-RateLimit-Limit": {
        "description": "Requests allowed per window",
        "schema": {"type": "integer"},
    },
    "X-RateLimit-Remaining": {"description": "Left in this window", "schema": {"type": "integer"}},
    "X-RateLimit-Reset": {
        "description": "Seconds until the window ends",
        "schema": {"type": "integer"},
    },
}


def _json(schema: dict[str, Any], description: str, **more: Any) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {**_HEADERS, **more.pop("headers", {})},
        "content": {"application/json": {"schema": schema}},
        **more,
    }


def _responses(ok: dict[str, Any], statuses: tuple[int, ...]) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": ok}
    for status in sorted(set(statuses)):
        name = "InternalError" if status == 500 else "Error"
        headers: dict[str, Any] = {}
        if status == 401:
            headers["WWW-Authenticate"] = {"schema": {"type": "string"}}
        if status == 429:
            headers.update({**_RATE_HEADERS, "Retry-After": {"schema": {"type": "integer"}}})
        responses[str(status)] = _json(_ref(name), _ERRORS[status], headers=headers)
    return responses


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {
        "in": "path",
        "name": name,
        "description": description,
        "required": True,
        "schema": {"type": "string", "format": "uuid", "pattern": f"^{UUID_TEXT}$"},
    }


_ORG_PARAM = _path_param("organizationId", "ID of the requested organization.")
_KEY_PARAM = _path_param("keyId", "ID of the requested key (its UUID, not the Basic-auth key ID).")
_ROLE_PARAM = _path_param("roleId", "ID of the requested role.")
_ACTIVITY_PARAM = _path_param("activityId", "ID of the requested activity.")
# Upstream's date filters of the activity list.
_DATE_PARAMS = [
    {
        "in": "query",
        "name": name,
        "description": f"{what} (included); ISO-8601 with a time zone offset.",
        "schema": {"type": "string", "format": "date-time"},
    }
    for name, what in (("from_date", "A starting date for a search"),
                       ("to_date", "An ending date for a search"))
]  # fmt: skip
# keysvc's records that upstream's closed enums lack are listed only when asked for.
_INCLUDE_PARAM = {
    "in": "query",
    "name": "include",
    "description": "keysvc addition: `keysvc` lists every record, keysvc's activity types"
    " and keyUpdateTypes (x-keysvc-enum-additions) included. Without it, only records whose"
    " type and keyUpdateType are upstream's are listed, and counted in totalCount, so that a"
    " client generated from upstream's document reads every page.",
    "required": False,
    "schema": {"type": "string", "enum": ["keysvc"]},
    "x-keysvc-addition": True,
}
_WEBHOOK_PARAM = _path_param("webhookId", "ID of the requested webhook.")
_LIST_PARAMS = [
    {
        "in": "query",
        "name": "limit",
        "description": "keysvc addition: page size, 1 to 250 (default 250).",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": s.MAX_PAGE, "default": s.MAX_PAGE},
        "x-keysvc-addition": True,
    },
    {
        "in": "query",
        "name": "cursor",
        "description": "keysvc addition: the nextCursor of the previous page.",
        "required": False,
        "schema": {"type": "string"},
        "x-keysvc-addition": True,
    },
]


def _paging(counted: str) -> dict[str, Any]:
    """The envelope's paging fields, for a list of ``counted``."""
    return {
        "nextCursor": {
            "type": ["string", "null"],
            "description": "keysvc addition: cursor of the next page; null on the last page.",
            "x-keysvc-addition": True,
        },
        "totalCount": {
            "type": "integer",
            "description": f"keysvc addition: {counted} in the organization.",
            "x-keysvc-addition": True,
        },
    }


_ETAG = {"ETag": {"description": "Version of the key, for If-Match", "schema": {"type": "string"}}}
_IF_MATCH = {
    "in": "header",
    "name": "If-Match",
    "required": False,
    "description": "keysvc addition: apply only if the key's ETag is one of these, or `*` "
    "(else 412). The ETag covers the key's roles' permissions too.",
    "schema": {"type": "string"},
    "x-keysvc-addition": True,
}
_PATH_PARAMS = {
    "organizationId": _ORG_PARAM,
    "keyId": _KEY_PARAM,
    "roleId": _ROLE_PARAM,
    "activityId": _ACTIVITY_PARAM,
    "webhookId": _WEBHOOK_PARAM,
    "deliveryId": _path_param("deliveryId", "ID of the delivery (its `id` in the delivery log)."),
    "identityId": _path_param("identityId", "ID of the requested identity."),
}
_PATH_PARAM = re.compile(r"\{([^}]+)\}")


def _params(route: Route) -> list[dict[str, Any]]:
    """The route's path parameters, then its query and header ones."""
    params = [
        _PATH_PARAMS.get(name)
        or {"in": "path", "name": name, "required": True, "schema": {"type": "string"}}
        for name in _PATH_PARAM.findall(route.path)
    ]
    if route is LIST_ACTIVITIES:
        params.extend([*_DATE_PARAMS, _INCLUDE_PARAM])
    if route is LIST_KEYS:
        params.append({**EXTERNAL_ID_PARAM, "schema": NAME_RULE})
    if route.paged:
        params.extend(_LIST_PARAMS)
    if route.query:
        # apispec makes one parameter of each of the schema's fields.
        params.append({"in": "query", "schema": route.query})
    if route.if_match:
        params.append(_IF_MATCH)
    return params


def _op(
    route: Route,
    ok: dict[str, Any],
    operation_id: str | None = None,
    params: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": operation_id or route.operation_id,
        "summary": route.summary,
        "tags": [route.tag],
        "parameters": _params(route) if params is None else params,
        "responses": _responses(ok, route.statuses + (_WITH_BODY if route.body else ())),
    }
    if route.description:
        operation["description"] = route.description
    elif route.permission:
        operation["description"] = f"Needs the permission `{route.permission}`."
    if route.body:
        operation["requestBody"] = {
            "required": route.body_required,
            "content": {"application/json": {"schema": _ref(_COMPONENT_OF[route.body])}},
        }
    return operation


def _authenticated(route: Route) -> dict[str, Any]:
    """An operation whose success is the envelope around the route's response."""
    if route.response is None:
        return _op(route, _json(_envelope(None), route.answer))
    result = _ref(_COMPONENT_OF[route.response])
    if route.paged:
        page = _envelope({"type": "array", "items": result}, **_paging(route.paged))
        return _op(route, _json(page, route.answer))
    if route.many:
        return _op(route, _json(_envelope({"type": "array", "items": result}), route.answer))
    # A key's answer carries its ETag, for a later If-Match.
    headers = _ETAG if route.response is r.ApiKeySchema else {}
    return _op(route, _json(_envelope(result), route.answer, headers=headers))


def _operations() -> dict[str, dict[str, Any]]:
    operations: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        on_path = operations.setdefault(route.path, {})
        if route.method == "*":
            on_path.update({m: _with_reuse(_verify(route, m)) for m in ("get", "head", "post")})
        elif route is GITHUB_SCANNING:
            ok = _json(reports.SCANNING_FEEDBACK, route.answer)
            token = _ref(_COMPONENT_OF[reports.ScanningTokenSchema])
            on_path[route.method.lower()] = reports.scanning_operation(_op(route, ok), token)
        elif route.media_type:
            on_path[route.method.lower()] = _plain(route, route.media_type)
        elif route.public:
            on_path[route.method.lower()] = _public(route)
        else:
            on_path[route.method.lower()] = _authenticated(route)
    return operations


def _link(operations: dict[str, dict[str, Any]]) -> None:
    """OpenAPI links from a create, and from each call on one object, to the calls on it.

    A client (and a stateful test) can follow them: create a key, read it, delete it,
    then read it again and get the 404.
    """
    for collection, item, param, created in (
        (KEYS_PATH, KEY_PATH, "keyId", "$response.body#/result/key/id"),
        (ROLES_PATH, ROLE_PATH, "roleId", "$response.body#/result/id"),
        (WEBHOOKS_PATH, WEBHOOK_PATH, "webhookId", "$response.body#/result/webhook/id"),
    ):
        on_item = operations[item]
        post = operations[collection]["post"]["responses"]
        post["200"] = {**post["200"], "links": _links(on_item, param, created)}
        for operation in on_item.values():
            # Response objects are shared between operations; links belong to one.
            ok = operation["responses"]["200"]
            operation["responses"]["200"] = {
                **ok,
                "links": _links(on_item, param, f"$request.path.{param}"),
            }


def _links(on_item: dict[str, Any], param: str, value: str) -> dict[str, Any]:
    noun = param.removesuffix("Id").capitalize()
    return {
        f"{method.capitalize()}{noun}": {
            "operationId": operation["operationId"],
            "parameters": {"organizationId": "$request.path.organizationId", param: value},
        }
        for method, operation in on_item.items()
    }


def _with_reuse(operation: dict[str, Any]) -> dict[str, Any]:
    """``operation`` with the reuse headers (keysvc.http.reuse) on each answer but a 500."""
    for status, response in operation["responses"].items():
        if status != "500":
            response["headers"] = {**response["headers"], **REUSE_HEADERS_DOCUMENTED}
    return operation


def _verify(route: Route, method: str) -> dict[str, Any]:
    """Forward auth (keysvc addition): any method; these three are the ones proxies use."""
    ok = {
        "description": "Allowed: no body (JSON with Accept: application/json); the headers "
        "say who the caller is.",
        **VERIFY_JSON,
        "headers": {
            **_HEADERS,
            **_RATE_HEADERS,
            **VERIFY_HEADERS,
            "X-Key-Id": {"description": "The key's UUID", "schema": {"type": "string"}},
            "X-Organization-Id": {"description": "Its organization", "schema": {"type": "string"}},
            "X-Key-Permissions": {
                "description": "Its effective permissions, comma-separated and sorted; at "
                f"most {MAX_PERMISSIONS_HEADER} characters, past which the entries that fit "
                "are followed by one such as +12 more, which is no permission",
                "schema": {"type": "string"},
            },
        },
    }
    return _op(
        route,
        ok,
        f"{route.operation_id}{method.capitalize()}",
        [
            {
                "in": "header",
                "name": "X-Required-Permission",
                "required": False,
                "description": "A permission query the key must meet: a permission "
                "name (wildcards apply), or names joined by AND and OR with parentheses, "
                "AND binding tighter, such as `reports:read AND (region:eu OR region:any)`. "
                f"At most {MAX_QUERY_LENGTH} characters, {MAX_TERMS} names and {MAX_DEPTH} "
                "levels of parentheses (the pattern shows a part of that: up to 8 terms, each a "
                "name or up to 4 names in parentheses). Empty is the same as absent.",
                # Empty is allowed: the view falls back to the query parameter.
                "schema": {**QUERY_RULE, "pattern": f"^$|{QUERY_PATTERN}"},
            },
            {
                "in": "query",
                "name": "permission",
                "required": False,
                "description": "The same, for proxies that cannot set a header; when both "
                "are given, the key must meet both.",
                "schema": {**QUERY_RULE, "pattern": QUERY_PATTERN},
            },
            {
                "in": "header",
                "name": "X-Required-Organization",
                "required": False,
                "description": "The organization the key must belong to (its ID). Empty is "
                "the same as absent.",
                "schema": {"type": "string", "pattern": f"^(?:|{UUID_TEXT})$"},
            },
            {
                "in": "query",
                "name": "organization",
                "required": False,
                "description": "The same, for proxies that cannot set a header; when both "
                "are given, the key must belong to both (so they must be the same).",
                "schema": {"type": "string", "format": "uuid", "pattern": f"^{UUID_TEXT}$"},
            },
            *VERIFY_PARAMS,
        ],
    )


def _plain(route: Route, media_type: str) -> dict[str, Any]:
    """A public operation whose success is not an envelope."""
    operation = _op(route, {})
    operation["responses"]["200"] = {
        "description": route.summary,
        "headers": _HEADERS,
        "content": {media_type: {"schema": {"type": "string"} if "json" not in media_type
                                 else {"type": "object"}}},
    }  # fmt: skip
    operation["security"] = []
    return operation


def _public(route: Route) -> dict[str, Any]:
    """A public operation whose result is an object of the route's string ``fields``."""
    result = {
        "type": "object",
        "properties": {name: {"type": "string"} for name in route.fields},
        "required": list(route.fields),
    }
    operation = _op(route, _json(_envelope(result), route.summary))
    operation["security"] = []
    return operation


@cache
def document_text() -> str:
    """The document as served, built once per process on its first request rather than
    with each app: it is pure, and building it costs more than the rest of an app."""
    return json.dumps(build_spec())


def build_spec() -> dict[str, Any]:
    """The whole document as a dict. Pure: the same for every app of a process."""
    plugin = MarshmallowPlugin()
    spec = APISpec(
        title="keysvc",
        version=__version__,
        openapi_version="3.1.0",
        plugins=[plugin],
        info={
            "description": "Self-hosted API key management, wire-compatible with the keys "
            "and roles operations of the hosted API it was cut from."
        },
        security=[{"basicAuth": []}],
    )
    # apispec does not annotate this method; it maps our datetime fields.
    plugin.map_to_openapi_type(s.Timestamp, "string", "date-time")  # type: ignore[no-untyped-call]
    plugin.map_to_openapi_type(s.ExpireAt, "string", "date-time")  # type: ignore[no-untyped-call]
    plugin.map_to_openapi_type(q.QueryMoment, "string", "date-time")  # type: ignore[no-untyped-call]
    spec.components.security_scheme(
        "basicAuth",
        {"type": "http", "scheme": "basic", "description": "Key ID and key secret."},
    )
    now = utcnow()
    for name, schema in _components(now):
        spec.components.schema(name, schema=schema)
    for status_type, name in (("number", "Error"), ("integer", "InternalError")):
        spec.components.schema(name, _error_schema(status_type))
    operations = _operations()
    _link(operations)
    for path, path_operations in operations.items():
        spec.path(path=path, operations=path_operations)
    document = spec.to_dict()
    tighten(document["components"]["schemas"])
    document["webhooks"] = delivery_webhooks()
    return document


def _components(now: datetime) -> tuple[tuple[str, Schema | type[Schema]], ...]:
    """The schema components by their upstream names; the request schemas check
    expireAt against ``now``."""
    return (
        ("AssignedRole", r.AssignedRoleSchema),
        ("IpAccessListEntry", s.IpAccessListEntrySchema),
        ("ApiKeyHashData", s.HashDataSchema),
        ("RateLimit", s.RateLimitSchema),
        ("ApiKey", r.ApiKeySchema),
        ("ApiKeyPostRequest", s.CreateKeySchema(now=now)),
        ("ApiKeyPatchRequest", s.PatchKeySchema(now=now)),
        ("ApiKeyPostResponse", r.CreateKeyResultSchema),
        ("ApiKeyRotateRequest", s.RotateKeySchema),
        ("RBACPolicyTags", rs.PolicyTagsSchema),
        ("RBACPolicy", r.PolicyOutSchema),
        ("RBACPolicyCreateRequest", rs.PolicySchema),
        ("RBACRole", r.RoleSchema),
        ("RoleCreateRequest", rs.CreateRoleSchema),
        ("RoleUpdateRequest", rs.UpdateRoleSchema),
        ("WhoAmI", r.WhoAmISchema),
        ("KeyUsageBucket", r.UsageBucketSchema),
        ("KeyUsage", r.UsageSchema),
        ("Activity", r.ActivitySchema),
        ("Webhook", r.WebhookSchema),
        ("WebhookCreateRequest", s.CreateWebhookSchema),
        ("WebhookCreateResponse", r.CreateWebhookResultSchema),
        ("WebhookDeliveryAttempt", r.AttemptSchema),
        ("WebhookDelivery", r.DeliverySchema),
        ("RevokeLeakedRequest", reports.RevokeLeakedSchema),
        ("GithubSecretScanningToken", reports.ScanningTokenSchema),
        ("WebhookUpdateRequest", ws.UpdateWebhookSchema),
        ("WebhookRotateSecretRequest", ws.RotateWebhookSecretSchema),
        ("WebhookRotateSecretResponse", r.RotateWebhookSecretResultSchema),
        # Issue 29.
        ("ApiKeyCreditsRequest", CreditsChangeSchema),
        # Issue 37.
        ("ApiKeyTokenHash", im.TokenHashSchema),
        ("ApiKeyImportRecord", im.ImportRecordSchema(now=now)),
        ("ApiKeyImportRequest", im.ImportKeysSchema),
        ("ApiKeyImported", im.ImportedKeySchema),
        ("ApiKeyImportError", im.ImportErrorSchema),
        ("ApiKeyImportResponse", im.ImportResultSchema),
        # Issue 36.
        ("Identity", ids.IdentitySchema),
        ("IdentityCreateRequest", ids.CreateIdentitySchema),
        ("IdentityUpdateRequest", ids.UpdateIdentitySchema),
    )


# A route's body or response schema by its component name.
_COMPONENT_OF: dict[type[Schema], str] = {
    schema if isinstance(schema, type) else type(schema): name
    for name, schema in _components(datetime.fromtimestamp(0, UTC))
}


def _error_schema(status_type: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["status", "error", "requestId"],
        "properties": {
            "status": {"type": status_type, "description": "HTTP status code."},
            "error": {"type": "string", "description": "Detailed error description."},
            "requestId": {
                "type": "string",
                "format": "uuid",
                "description": "Unique id assigned to every request. UUIDv4",
            },
        },
    }
