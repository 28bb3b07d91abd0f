"""Marshmallow schemas: one per request body and one per response shape.

Request schemas reject unknown fields (marshmallow's default) and say, per
field, what is wrong; ``load`` turns those messages into one readable
``BadRequest`` such as ``name: must be 1 to 255 characters``. Response
schemas follow the upstream OpenAPI document field for field.
"""

import ipaddress
import unicodedata
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from marshmallow import Schema, ValidationError, fields, post_dump, validate, validates

from keysvc.credentials import SUFFIX_LENGTH, is_sha256_b64
from keysvc.errors import BadRequest
from keysvc.timeutil import to_text

LEGACY_ROLES = ("admin", "developer", "query_endpoints")
KEY_STATES = ("enabled", "disabled")
MAX_NAME = 255
MAX_DESCRIPTION = 255
MAX_IP_ENTRIES = 100
MAX_ROLE_IDS = 100


def _has_control(value: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in value)


class Name(fields.String):
    """A name: trimmed, 1 to 255 characters, no control characters."""

    def _deserialize(self, value: Any, attr: str | None, data: Any, **kwargs: Any) -> str:
        text = super()._deserialize(value, attr, data, **kwargs).strip()
        if not 1 <= len(text) <= MAX_NAME:
            raise ValidationError(f"must be 1 to {MAX_NAME} characters")
        if _has_control(text):
            raise ValidationError("must not contain control characters")
        return text


class ExpireAt(fields.Field[datetime | None]):
    """An ISO-8601 date-time with an offset, normalised to UTC; null or "" mean never."""

    def __init__(self, **kwargs: Any):
        super().__init__(allow_none=True, **kwargs)

    def _deserialize(
        self, value: Any, attr: str | None, data: Mapping[str, Any] | None, **kwargs: Any
    ) -> datetime | None:
        if value == "":
            return None
        if not isinstance(value, str):
            raise ValidationError("must be an ISO-8601 date-time string, null or empty")
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValidationError(
                "must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z"
            ) from None
        if moment.tzinfo is None:
            raise ValidationError("must include a time zone offset, such as Z or +02:00")
        try:
            return moment.astimezone(UTC)
        except OverflowError:
            raise ValidationError("is out of range") from None


class Timestamp(fields.Field[datetime]):
    """Dumps a datetime in keysvc's one text form (UTC, trailing Z)."""

    def _serialize(self, value: datetime | None, attr: str | None, obj: Any, **kwargs: Any) -> Any:
        return None if value is None else to_text(value)


def _ip_source(value: str) -> None:
    if "%" in value:
        raise ValidationError("must not carry an IPv6 zone ID")
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        try:
            network = ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ValidationError("must be an IPv4 or IPv6 address or CIDR") from None
        raise ValidationError(f"has host bits set; did you mean {network}?") from None


def _no_control(value: str) -> None:
    if _has_control(value):
        raise ValidationError("must not contain control characters")


def _sha256_b64(value: str) -> None:
    if not is_sha256_b64(value):
        raise ValidationError("Not a sha256sum")


def _suffix(value: str) -> None:
    if len(value) != SUFFIX_LENGTH or _has_control(value):
        raise ValidationError(f"must be the last {SUFFIX_LENGTH} characters of the key ID")


class IpAccessListEntrySchema(Schema):
    source = fields.String(required=True, validate=_ip_source)
    description = fields.String(
        validate=[
            validate.Length(max=MAX_DESCRIPTION, error="must be at most {max} characters"),
            _no_control,
        ]
    )


class HashDataSchema(Schema):
    keyIdHash = fields.String(required=True, validate=_sha256_b64)
    keyIdSuffix = fields.String(required=True, validate=_suffix)
    keySecretHash = fields.String(required=True, validate=_sha256_b64)


class CreateKeySchema(Schema):
    """The create-key body. ``now`` is the clock reading that expireAt must be after."""

    name = Name(required=True)
    expireAt = ExpireAt()
    state = fields.String(
        load_default="enabled",
        validate=validate.OneOf(KEY_STATES, error="must be one of: enabled, disabled"),
    )
    hashData = fields.Nested(HashDataSchema)
    roles = fields.List(
        fields.String(
            validate=validate.OneOf(
                LEGACY_ROLES, error="must be one of: " + ", ".join(LEGACY_ROLES)
            )
        ),
        validate=validate.Length(min=1, error="must contain at least 1 element"),
    )
    assignedRoleIds = fields.List(
        fields.UUID(error_messages={"invalid_uuid": "must be a role UUID"}),
        validate=validate.Length(max=MAX_ROLE_IDS, error="must have at most {max} entries"),
    )
    ipAccessList = fields.List(
        fields.Nested(IpAccessListEntrySchema),
        validate=validate.Length(max=MAX_IP_ENTRIES, error="must have at most {max} entries"),
    )

    def __init__(self, *, now: datetime, **kwargs: Any):
        super().__init__(**kwargs)
        self.now = now

    @validates("expireAt")
    def _in_future(self, value: datetime | None, data_key: str) -> None:
        if value is not None and value <= self.now:
            raise ValidationError("must be in the future")


class AssignedRoleSchema(Schema):
    roleId = fields.String(attribute="id")
    roleName = fields.String(attribute="name")
    roleType = fields.String(attribute="type")


class ApiKeySchema(Schema):
    id = fields.String()
    name = fields.String()
    state = fields.String()
    roles = fields.Method("_legacy_roles", metadata={"deprecated": True})
    assignedRoles = fields.List(fields.Nested(AssignedRoleSchema), attribute="roles")
    keySuffix = fields.String(attribute="key_suffix")
    createdAt = Timestamp(attribute="created_at")
    expireAt = Timestamp(attribute="expire_at")
    usedAt = Timestamp(attribute="used_at")
    ipAccessList = fields.List(fields.Dict(), attribute="ip_access_list")

    def _legacy_roles(self, key: Any) -> list[str]:
        return [role.name for role in key.roles if role.type == "system"]

    @post_dump
    def _omit_unused(self, data: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        # usedAt is absent, not null, until the key is first used.
        if data.get("usedAt") is None:
            data.pop("usedAt", None)
        return data


class CreateKeyResultSchema(Schema):
    key = fields.Nested(ApiKeySchema)
    keyId = fields.String()
    keySecret = fields.String()


# marshmallow's stock messages, said the way the rest of keysvc says things.
_PLAIN = {
    "Missing data for required field.": "is required",
    "Unknown field.": "is not a known field",
    "Field may not be null.": "must not be null",
    "Not a valid string.": "must be a string",
    "Not a valid list.": "must be an array",
    "Invalid input type.": "must be an object",
}


def _flatten(messages: Any, prefix: str = "") -> list[str]:
    if isinstance(messages, Mapping):
        out: list[str] = []
        for name, inner in messages.items():
            path = prefix if name == "_schema" else f"{prefix}.{name}" if prefix else str(name)
            out.extend(_flatten(inner, path))
        return out
    if isinstance(messages, list | tuple):
        texts = [
            _PLAIN.get(str(m), str(m))
            for m in messages
            if not isinstance(m, Mapping | list | tuple)
        ]
        nested = [m for m in messages if isinstance(m, Mapping | list | tuple)]
        out = [f"{prefix}: {text}" if prefix else text for text in texts]
        for inner in nested:
            out.extend(_flatten(inner, prefix))
        return out
    return [f"{prefix}: {messages}" if prefix else str(messages)]


def load(schema: Schema, data: Mapping[str, Any]) -> dict[str, Any]:
    """Validate ``data``; every problem, field by field, becomes one BadRequest."""
    try:
        result: dict[str, Any] = schema.load(data)
    except ValidationError as exc:
        raise BadRequest("; ".join(sorted(_flatten(exc.messages)))) from None
    return result
