"""Marshmallow schemas of responses, one per shape, following the upstream OpenAPI
document field for field (``keysvc.openapi`` describes them from here; the hot key
routes are rendered by hand in ``keysvc.render``, tested equal to these)."""

import uuid
from typing import Any

from marshmallow import Schema, fields, post_dump

from keysvc.schemas import (
    ACTOR_PREFIX,
    ADDITION,
    EVENT_TYPES,
    IP_ACCESS_LIST_DOC,
    KEY_STATES,
    LEGACY_ROLES,
    RATE_LIMIT_DOC,
    ROLE_TYPES,
    UUID_TEXT,
    IpAccessListEntrySchema,
    PolicyTagsSchema,
    Timestamp,
)


def _array_of(ref: str) -> dict[str, Any]:
    return {"type": "array", "items": {"$ref": f"#/components/schemas/{ref}"}}


_RATE_REF = {"$ref": "#/components/schemas/RateLimit"}


class AssignedRoleSchema(Schema):
    roleId = fields.String(attribute="id", metadata=UUID_TEXT)
    roleName = fields.String(attribute="name")
    roleType = fields.String(attribute="type", metadata={"enum": list(ROLE_TYPES)})


class ApiKeySchema(Schema):
    id = fields.String(metadata=UUID_TEXT)
    name = fields.String()
    state = fields.String(metadata={"enum": list(KEY_STATES)})
    roles = fields.Method(
        "_legacy_roles",
        metadata={
            "type": "array",
            "items": {"type": "string", "enum": list(LEGACY_ROLES)},
            "deprecated": True,
            "description": "DEPRECATED, use assignedRoles: the key's system roles by name.",
        },
    )
    assignedRoles = fields.List(fields.Nested(AssignedRoleSchema), attribute="roles")
    keySuffix = fields.String(attribute="key_suffix")
    createdAt = Timestamp(attribute="created_at")
    expireAt = Timestamp(attribute="expire_at", allow_none=True)
    usedAt = Timestamp(attribute="used_at")
    ipAccessList = fields.List(
        fields.Nested(IpAccessListEntrySchema),
        attribute="ip_access_list",
        metadata={"description": IP_ACCESS_LIST_DOC},
    )
    rateLimit = fields.Method("_rate_limit", metadata={**RATE_LIMIT_DOC, **_RATE_REF})

    def _rate_limit(self, key: Any) -> dict[str, int] | None:
        if key.rate_limit is None:
            return None
        return {"limit": key.rate_limit[0], "windowSeconds": key.rate_limit[1]}

    def _legacy_roles(self, key: Any) -> list[str]:
        return [role.name for role in key.roles if role.type == "system"]

    @post_dump
    def _omit_unused(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        # usedAt is absent, not null, until the key is first used; rateLimit when unset.
        for name in ("usedAt", "rateLimit"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class PolicyOutSchema(Schema):
    id = fields.String()
    roleId = fields.String()
    tenantId = fields.String()
    allowDeny = fields.String(metadata={"enum": ["ALLOW", "DENY"]})
    permissions = fields.List(fields.String())
    resources = fields.List(fields.String())
    tags = fields.Nested(PolicyTagsSchema)


class RoleSchema(Schema):
    """Upstream's RBACRole, plus keysvc's flat ``permissions``."""

    id = fields.String(attribute="role.id")
    tenantId = fields.Function(
        lambda d: f"organization/{d.organization_id}", metadata={"type": "string"}
    )
    ownerId = fields.Function(
        lambda d: f"organization/{d.organization_id}", metadata={"type": "string"}
    )
    name = fields.String(attribute="role.name")
    type = fields.String(attribute="role.type", metadata={"enum": list(ROLE_TYPES)})
    actors = fields.Function(
        lambda d: [ACTOR_PREFIX + key_id for key_id in d.actors],
        metadata={"type": "array", "items": {"type": "string"}},
    )
    policies = fields.Function(
        lambda d: [PolicyOutSchema().dump(_policy(d))], metadata=_array_of("RBACPolicy")
    )
    permissions = fields.List(
        fields.String(),
        attribute="role.permissions",
        metadata={**ADDITION, "description": "keysvc addition: what the role grants."},
    )
    createdAt = Timestamp(attribute="role.created_at")
    updatedAt = Timestamp(attribute="role.updated_at")


def _policy(detail: Any) -> dict[str, Any]:
    return {
        # One ALLOW policy per role, so its ID can be derived rather than stored.
        "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"keysvc:policy:{detail.role.id}")),
        "roleId": detail.role.id,
        "tenantId": f"organization/{detail.organization_id}",
        "allowDeny": "ALLOW",
        "permissions": list(detail.role.permissions),
        "resources": ["*"],
        "tags": {},
    }


class WhoAmISchema(Schema):
    id = fields.String(metadata=UUID_TEXT)
    name = fields.String()
    organizationId = fields.String(attribute="organization_id", metadata=UUID_TEXT)
    assignedRoles = fields.List(fields.Nested(AssignedRoleSchema), attribute="roles")
    permissions = fields.Function(
        lambda key: sorted(key.permissions),
        metadata={"type": "array", "items": {"type": "string"}},
    )


class CreateKeyResultSchema(Schema):
    key = fields.Nested(ApiKeySchema)
    keyId = fields.String()
    keySecret = fields.String()


class WebhookSchema(Schema):
    id = fields.String(metadata=UUID_TEXT)
    url = fields.String()
    events = fields.List(fields.String(metadata={"enum": list(EVENT_TYPES)}))
    expiringDays = fields.Integer(attribute="expiring_days")
    createdAt = Timestamp(attribute="created_at")


class CreateWebhookResultSchema(Schema):
    webhook = fields.Nested(WebhookSchema)
    secret = fields.String(
        metadata={
            "description": "The signing secret, shown this once: keysvc cannot show it again."
        }
    )


class AttemptSchema(Schema):
    at = Timestamp()
    status = fields.Integer(
        allow_none=True, metadata={"description": "The receiver's HTTP status."}
    )
    error = fields.String(
        allow_none=True,
        metadata={
            "description": "Why there was no status: timeout, connection_refused, dns_error,"
            " blocked_address, tls_error, disconnected, http_error or error."
        },
    )


class DeliverySchema(Schema):
    id = fields.String(metadata=UUID_TEXT)
    eventId = fields.String(attribute="event_id", metadata=UUID_TEXT)
    eventType = fields.String(attribute="event_type", metadata={"enum": list(EVENT_TYPES)})
    createdAt = Timestamp(attribute="created_at")
    state = fields.String(metadata={"enum": ["pending", "delivered", "failed"]})
    attemptCount = fields.Function(lambda d: len(d.attempts), metadata={"type": "integer"})
    attempts = fields.List(fields.Nested(AttemptSchema))
    nextAttemptAt = Timestamp(attribute="next_attempt_at", allow_none=True)
