"""The bodies of role writes and their upstream policies, loaded as
``keysvc.http.schemas`` loads the others (moved out of it to keep each module small)."""

from collections.abc import Mapping
from typing import Any

from marshmallow import Schema, ValidationError, fields, pre_load, validate, validates_schema

from keysvc.domain.limits import ACTOR_PREFIX
from keysvc.domain.permissions import MAX_PERMISSION_LENGTH, PERMISSION
from keysvc.http.schemas import (
    ADDITION,
    MAX_ACTORS,
    MAX_GRANTS,
    MAX_PERMISSIONS,
    UUID_PATTERN,
    BoundedList,
    Name,
)


def _permission(value: str) -> None:
    if len(value) > MAX_PERMISSION_LENGTH or not PERMISSION.fullmatch(value):
        raise ValidationError(
            "must be *, namespace:* or namespace:action in lowercase, such as reports:read"
        )


def _actor(value: str) -> None:
    rest = value.removeprefix(ACTOR_PREFIX)
    if rest == value or not UUID_PATTERN.fullmatch(rest):
        raise ValidationError("must be apiKey/<key UUID>; keysvc has no users")


_STAR_ONLY = 'keysvc grants permissions on every resource: use ["*"]'


def _star_only(value: list[str]) -> None:
    if value != ["*"]:
        raise ValidationError(_STAR_ONLY)


def _allow_only(value: str) -> None:
    if value != "ALLOW":
        raise ValidationError("only ALLOW is supported: keysvc roles grant")


class PolicyTagsSchema(Schema):
    """Upstream's database grants for a policy: keysvc has none, so only {} is accepted."""

    grants = BoundedList(
        fields.String(),
        validate=validate.Length(max=MAX_GRANTS, error="must have at most {max} entries"),
    )
    roleV2 = fields.String(metadata={"enum": ["sql-console-readonly", "sql-console-admin"]})

    @validates_schema
    def _empty(self, data: dict[str, Any], **kwargs: Any) -> None:
        if data:
            raise ValidationError("are not supported by keysvc: send {} or leave tags out")


class PolicySchema(Schema):
    """An upstream policy. keysvc roles only grant, on every resource."""

    allowDeny = fields.String(
        required=True,
        validate=_allow_only,
        metadata={
            "enum": ["ALLOW", "DENY"],
            "description": "keysvc roles only grant: DENY is refused with a 400.",
        },
    )
    permissions = BoundedList(
        fields.String(validate=_permission),
        required=True,
        validate=validate.Length(max=MAX_PERMISSIONS, error="must have at most {max} entries"),
    )
    # At most one entry, "*": the bound says the same as _star_only, before the entries.
    resources = BoundedList(
        fields.String(),
        required=True,
        validate=[validate.Length(max=1, error=_STAR_ONLY), _star_only],
    )
    tags = fields.Nested(PolicyTagsSchema)


_AT_MOST_PERMISSIONS = f"must have at most {MAX_PERMISSIONS} entries"


class _RoleFieldsSchema(Schema):
    name = Name()
    permissions = BoundedList(
        fields.String(validate=_permission),
        validate=validate.Length(max=MAX_PERMISSIONS, error=_AT_MOST_PERMISSIONS),
        metadata={**ADDITION, "description": "keysvc addition: the permissions the role grants"},
    )
    policies = BoundedList(
        fields.Nested(PolicySchema),
        validate=validate.Length(max=MAX_PERMISSIONS, error="must have at most {max} entries"),
    )
    actors = BoundedList(
        fields.String(validate=_actor),
        validate=validate.Length(max=MAX_ACTORS, error="must have at most {max} entries"),
    )

    @pre_load
    def _permissions_in_all(self, data: Any, **kwargs: Any) -> Any:
        """A role grants at most MAX_PERMISSIONS, its policies' included: counted as sent,
        before any entry is read, so that many policies cannot make up a long list."""
        if isinstance(data, Mapping):
            sent = _entries(data.get("permissions")) + sum(
                _entries(policy.get("permissions"))
                # Past this many the policies are refused anyway; their length is not read.
                for policy in _listed(data.get("policies"))[: MAX_PERMISSIONS + 1]
                if isinstance(policy, Mapping)
            )
            if _entries(data.get("permissions")) > MAX_PERMISSIONS:
                raise ValidationError(_AT_MOST_PERMISSIONS, field_name="permissions")
            if sent > MAX_PERMISSIONS:
                raise ValidationError(
                    f"a role grants at most {MAX_PERMISSIONS} permissions, its policies'"
                    f" included; this body has {sent}",
                    field_name="permissions",
                )
        return data


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _entries(value: Any) -> int:
    return len(_listed(value))


class CreateRoleSchema(_RoleFieldsSchema):
    name = Name(required=True)


class UpdateRoleSchema(_RoleFieldsSchema):
    """Every field optional; permissions/policies and actors replace."""
