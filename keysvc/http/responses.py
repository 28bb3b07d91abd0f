"""Marshmallow schemas of responses, one per shape, following the upstream OpenAPI
document field for field (``keysvc.http.openapi`` describes them from here; the hot key
routes are rendered by hand in ``keysvc.http.render``, tested equal to these)."""

import json
import uuid
from typing import Any

from marshmallow import Schema, fields, post_dump

from keysvc.domain.activities import ACTOR_TYPES, ADDED_TYPES, ADDED_UPDATE_TYPES, UPSTREAM_TYPES
from keysvc.domain.limits import ACTOR_PREFIX
from keysvc.domain.namedlimits import NAME_PATTERN
from keysvc.http.keyfields import CREDITS_DOC, EXTERNAL_ID_DOC, META_DOC, NAMED_LIMITS_DOC
from keysvc.http.queries import USAGE_GRANULARITIES
from keysvc.http.role_schemas import PolicyTagsSchema
from keysvc.http.schemas import (
    ADDITION,
    EVENT_TYPES,
    IP_ACCESS_LIST_DOC,
    KEY_STATES,
    LEGACY_ROLES,
    RATE_LIMIT_DOC,
    ROLE_TYPES,
    UUID_TEXT,
    IpAccessListEntrySchema,
    Timestamp,
)
from keysvc.keyview import credits_json


def _array_of(ref: str) -> dict[str, Any]:
    return {"type": "array", "items": {"$ref": f"#/components/schemas/{ref}"}}


_RATE_REF = {"$ref": "#/components/schemas/RateLimit"}
# A key's named rate limit as answered (keysvc.http.keyfields.NamedLimitSchema's fields).
NAMED_LIMIT_ITEM = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN.pattern},
        "limit": {"type": "integer", "minimum": 1},
        "windowSeconds": {"type": "integer", "minimum": 1},
        "autoApply": {"type": "boolean"},
    },
}


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
            "replaced stop working; absent when it kept none, and once they have stopped "
            "(their hashes are deleted within 5 minutes of the end).",
        },
    )

    # Issue 29: absent when unset (no externalId, no meta, unlimited credits).
    externalId = fields.String(
        attribute="external_id", metadata={**ADDITION, "description": EXTERNAL_ID_DOC}
    )
    meta = fields.Dict(metadata={**ADDITION, "description": META_DOC})
    credits = fields.Method(
        "_credits",
        metadata={
            **CREDITS_DOC,
            "type": "object",
            "properties": {
                "remaining": {"type": "integer", "minimum": 0},
                "refill": {
                    "type": ["object", "null"],
                    "properties": {
                        "interval": {"type": "string", "enum": ["daily", "monthly"]},
                        "amount": {"type": "integer", "minimum": 1},
                        "refillDay": {"type": ["integer", "null"], "minimum": 1, "maximum": 31},
                    },
                },
                "nextRefillAt": {"type": ["string", "null"], "format": "date-time"},
            },
        },
    )

    # Issue 36: absent when the key has none.
    ratelimits = fields.Method(
        "_ratelimits",
        metadata={**NAMED_LIMITS_DOC, "type": "array", "items": NAMED_LIMIT_ITEM},
    )

    def _ratelimits(self, key: Any) -> list[dict[str, Any]] | None:
        return None if key.ratelimits is None else list(json.loads(key.ratelimits))

    # Issue 36: the identity the key belongs to (by its externalId); absent without one.
    identityId = fields.String(
        attribute="identity_id",
        metadata={
            **ADDITION,
            "format": "uuid",
            "description": "keysvc addition: the identity of the organization whose externalId "
            "is the key's; absent when there is none.",
        },
    )

    def _credits(self, key: Any) -> dict[str, Any] | None:
        return credits_json(key.credits)

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
        for name in (
            "usedAt", "rateLimit", "previousCredentialExpiresAt", "externalId", "meta", "credits",
            "ratelimits",
            "identityId",
        ):  # fmt: skip
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
    """One bucket of a key's usage series (``keysvc.domain.usage``)."""

    start = Timestamp(metadata={"description": "The bucket's start (UTC)."})
    success = fields.Integer(
        metadata={"description": _COUNT_OF + "admitted (any answer but a 403)."}
    )
    disabled = fields.Integer(metadata={"description": _COUNT_OF + "refused: key disabled."})
    expired = fields.Integer(metadata={"description": _COUNT_OF + "refused: key expired."})
    ipDenied = fields.Integer(
        attribute="ip_denied",
        metadata={"description": _COUNT_OF + "refused: address outside its IP access list."},
    )
    forbidden = fields.Integer(
        metadata={
            "description": _COUNT_OF + "refused with a 403: another organization, a missing"
            " permission, or a view's own rule (such as a stronger key's)."
        }
    )
    rateLimited = fields.Integer(
        attribute="rate_limited",
        metadata={"description": _COUNT_OF + "refused: over the key's request limit."},
    )
    creditsExhausted = fields.Integer(
        attribute="credits_exhausted",
        metadata={
            **ADDITION,
            "description": _COUNT_OF + "refused by verify: not enough credits (issue 29).",
        },
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


# Upstream's enums, which keysvc's extend (its own values listed after upstream's, and
# named in x-keysvc-enum-additions): a client that knows upstream's values sees them
# unchanged.
# Every type upstream lists, of which keysvc records UPSTREAM_TYPES.
UPSTREAM_ACTIVITY_TYPES = (
    "create_organization", "organization_update_name", "transfer_service_in",
    "transfer_service_out", "save_payment_method", "marketplace_subscription",
    "migrate_marketplace_billing_details_in", "migrate_marketplace_billing_details_out",
    "organization_update_tier", "organization_invite_create", "organization_invite_delete",
    "organization_member_join", "organization_member_add", "organization_member_leave",
    "organization_member_delete", "organization_member_update_role",
    "organization_member_update_roles", "organization_member_update_mfa_method",
    "organization_saml_connection_create", "organization_saml_connection_update", "user_login",
    "user_login_failed", "user_logout", "key_create", "key_delete", "openapi_key_update",
    "service_create", "service_start", "service_stop", "service_awaken", "service_idle",
    "service_running", "service_partially_running", "service_delete", "service_update_name",
    "service_update_ip_access_list", "service_update_autoscaling_memory",
    "service_update_autoscaling_idling", "service_update_password",
    "service_update_autoscaling_replicas", "service_update_max_allowable_replicas",
    "service_update_backup_configuration", "service_update_snapshot_configuration",
    "service_restore_backup", "service_update_release_channel",
    "service_update_gpt_usage_consent", "service_update_private_endpoints",
    "service_import_to_organization", "service_export_from_organization",
    "service_maintenance_start", "service_maintenance_end", "service_update_core_dump",
    "backup_delete",
)  # fmt: skip
UPSTREAM_KEY_UPDATE_TYPES = (
    "created", "deleted", "name-changed", "role-changed", "state-changed", "date-changed",
    "ip-access-list-changed", "org-role-changed", "default-service-role-changed",
    "service-role-changed", "roles-v2-changed",
)  # fmt: skip


def _extended(upstream: tuple[str, ...], added: tuple[str, ...], what: str) -> dict[str, Any]:
    return {
        "enum": [*upstream, *added],
        "x-keysvc-enum-additions": list(added),
        "description": f"{what}. keysvc additions: {', '.join(added)}.",
    }


_CHANGED = {
    **ADDITION,
    "type": ["object", "null"],
    "description": "keysvc addition: the public values of what changed (never a secret "
    "or a hash), by field name.",
}


class ActivitySchema(Schema):
    """Upstream's Activity. Only ``None`` values are left out, as upstream leaves out
    what does not apply (serviceId: keysvc has no services)."""

    id = fields.String(metadata={"description": "Unique activity ID.", **UUID_TEXT})
    createdAt = Timestamp(attribute="created_at")
    type = fields.String(
        metadata=_extended(
            UPSTREAM_ACTIVITY_TYPES,
            ADDED_TYPES,
            f"Type of the activity; keysvc records {', '.join(UPSTREAM_TYPES)}",
        )
    )
    actorType = fields.String(
        attribute="actor.type",
        metadata={"enum": ["user", "support", "system", "api"], "description": "Type of the "
                  f"actor; keysvc records {' and '.join(ACTOR_TYPES)}."},
    )  # fmt: skip
    actorId = fields.String(
        attribute="actor.id", metadata={"description": "For api: the calling key's UUID."}
    )
    actorDetails = fields.String(attribute="actor.details")
    actorIpAddress = fields.String(
        attribute="actor.ip", metadata={"description": "For api: the client address keysvc "
                                         "believes (trusted proxies honoured)."}
    )  # fmt: skip
    organizationId = fields.String(attribute="organization_id")
    serviceId = fields.String(attribute="service_id")
    userAgent = fields.String(
        attribute="actor.user_agent",
        metadata={"description": "User agent of the actor, at most 512 characters."},
    )
    targetKeyId = fields.String(attribute="target_key_id")
    keyUpdateType = fields.String(
        attribute="key_update_type",
        metadata=_extended(
            UPSTREAM_KEY_UPDATE_TYPES, ADDED_UPDATE_TYPES, "Type of update (key activities)"
        ),
    )
    targetRoleId = fields.String(
        attribute="target_role_id",
        metadata={**ADDITION, "description": "keysvc addition: the role of a role event."},
    )
    before = fields.Raw(metadata=_CHANGED)
    after = fields.Raw(metadata=_CHANGED)

    @post_dump
    def _omit_unset(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {name: value for name, value in data.items() if value is not None}


class WebhookSchema(Schema):
    id = fields.String(metadata=UUID_TEXT)
    url = fields.String()
    events = fields.List(fields.String(metadata={"enum": list(EVENT_TYPES)}))
    expiringDays = fields.Integer(attribute="expiring_days")
    createdAt = Timestamp(attribute="created_at")
    enabled = fields.Boolean(
        metadata={
            "description": "false: disabled, by PATCH or after failing every attempt for"
            " KEYSVC_WEBHOOK_DISABLE_AFTER_HOURS; it is sent nothing until enabled again."
        }
    )
    disabledAt = Timestamp(attribute="disabled_at", allow_none=True)
    failingSince = Timestamp(
        attribute="failing_since",
        allow_none=True,
        metadata={"description": "Since when every attempt has failed (null: the last worked)."},
    )
    previousSecretExpiresAt = Timestamp(
        attribute="previous_until",
        allow_none=True,
        metadata={
            "description": "After a secret's rotation: until when the replaced secret"
            " signs deliveries too (null: never rotated)."
        },
    )


class CreateWebhookResultSchema(Schema):
    webhook = fields.Nested(WebhookSchema)
    secret = fields.String(
        metadata={
            "description": "The signing secret, shown this once: keysvc cannot show it again."
            " A Standard Webhooks secret: whsec_ and the standard base64 of 32 bytes.",
            "pattern": "^whsec_[A-Za-z0-9+/]{43}=$",
        }
    )


class RotateWebhookSecretResultSchema(Schema):
    webhook = fields.Nested(WebhookSchema)
    secret = fields.String(
        metadata={
            "description": "The new signing secret, shown this once (whsec_ and the standard"
            " base64 of 32 bytes). The replaced one signs too until the webhook's"
            " previousSecretExpiresAt.",
            "pattern": "^whsec_[A-Za-z0-9+/]{43}=$",
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
            " blocked_address, tls_error, disconnected, http_error or error; unauthenticated"
            " when keysvc did not send it, as its outbox row's MAC did not verify."
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
