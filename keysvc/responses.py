"""Marshmallow schemas of responses, one per shape, following the upstream OpenAPI
document field for field (``keysvc.openapi`` describes them from here; the hot key
routes are rendered by hand in ``keysvc.render``, tested equal to these)."""

import uuid
from typing import Any

from marshmallow import Schema, fields, post_dump

from keysvc.schemas import (
    ACTOR_PREFIX,
    ADDITION,
    IP_ACCESS_LIST_DOC,
    KEY_STATES,
    LEGACY_ROLES,
    RATE_LIMIT_DOC,
    ROLE_TYPES,
    USAGE_GRANULARITIES,
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
    previousCredentialExpiresAt = Timestamp(
        attribute="previous_until",
        metadata={
            **ADDITION,
            "description": "keysvc addition: when the key ID and secret its last rotation "
            "replaced stop working (past once they have); absent when it kept none.",
        },
    )

    def _rate_limit(self, key: Any) -> dict[str, int] | None:
        if key.rate_limit is None:
            return None
        return {"limit": key.rate_limit[0], "windowSeconds": key.rate_limit[1]}

    def _legacy_roles(self, key: Any) -> list[str]:
        return [role.name for role in key.roles if role.type == "system"]

    @post_dump
    def _omit_unused(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        # usedAt is absent, not null, until the key is first used; rateLimit when unset,
        # previousCredentialExpiresAt when no rotation kept the credentials it replaced.
        for name in ("usedAt", "rateLimit", "previousCredentialExpiresAt"):
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


_COUNT_OF = "Authentications of the key in the bucket that ended "


class UsageBucketSchema(Schema):
    """One bucket of a key's usage series (``keysvc.usage``)."""

    start = Timestamp(metadata={"description": "The bucket's start (UTC)."})
    success = fields.Integer(metadata={"description": _COUNT_OF + "admitted."})
    disabled = fields.Integer(metadata={"description": _COUNT_OF + "refused: key disabled."})
    expired = fields.Integer(metadata={"description": _COUNT_OF + "refused: key expired."})
    ipDenied = fields.Integer(
        attribute="ip_denied",
        metadata={"description": _COUNT_OF + "refused: address outside its IP access list."},
    )
    forbidden = fields.Integer(
        metadata={
            "description": _COUNT_OF + "refused: another organization, or a missing permission."
        }
    )
    rateLimited = fields.Integer(
        attribute="rate_limited",
        metadata={"description": _COUNT_OF + "refused: over the key's request limit."},
    )


class UsageSchema(Schema):
    """A key's usage series: every bucket from ``from`` up to ``to``, zeros included."""

    granularity = fields.String(metadata={"enum": list(USAGE_GRANULARITIES)})
    start = Timestamp(data_key="from", metadata={"description": "Start of the first bucket."})
    end = Timestamp(data_key="to", metadata={"description": "End of the last bucket."})
    series = fields.List(
        fields.Nested(UsageBucketSchema),
        attribute="buckets",
        metadata={"description": "Every bucket in time order, zero-filled."},
    )
