"""The rules the request schemas check in Python functions, which apispec cannot see,
written into the OpenAPI document's schemas as JSON Schema: names, permissions, UUIDs,
hashes, roles and policies (``tighten``), for ``keysvc.http.openapi``."""

from typing import Any

from keysvc.credentials import SUFFIX_LENGTH
from keysvc.domain.limits import MAX_ROLE_IDS
from keysvc.domain.permissions import MAX_PERMISSION_LENGTH, PERMISSION
from keysvc.domain.permquery import MAX_QUERY_LENGTH
from keysvc.http import schemas as s
from keysvc.http import verifydoc

# Control characters (category Cc); what names and descriptions must not hold (those,
# and the characters not shown as themselves, keysvc.http.schemas.INVISIBLE); and the
# whitespace str.strip() removes from both ends of a name before it is checked.
_CC = r"\x00-\x1f\x7f-\x9f"
_HIDDEN = _CC + s.INVISIBLE
_WS = r"\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NAME_RULE = {
    "type": "string",
    "pattern": f"^[{_WS}]*[^{_WS}{_HIDDEN}](?:[^{_HIDDEN}]{{0,{s.MAX_NAME - 2}}}"
    f"[^{_WS}{_HIDDEN}])?[{_WS}]*$",
    "description": f"1 to {s.MAX_NAME} characters once leading and trailing whitespace "
    "is trimmed, no control, invisible or formatting characters.",
}
PERMISSION_RULE = {
    "type": "string",
    "maxLength": MAX_PERMISSION_LENGTH,
    "pattern": f"^(?:{PERMISSION.pattern})$",
}
# A permission query on verify (keysvc.domain.permquery); each parameter adds its pattern.
QUERY_RULE = {"type": "string", "maxLength": MAX_QUERY_LENGTH}
# Canonical lowercase, the only form keysvc accepts in a path or an actor.
UUID_TEXT = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_SHA256_B64 = {
    "type": "string",
    "pattern": "^[A-Za-z0-9+/]{43}=$",
    "description": "Base64 of a SHA-256 digest (44 characters).",
}


_ONE_ROLE = "A key needs at least one role: a non-empty roles or assignedRoleIds."
_EXPIRE_AT = 'When the key stops working: a date-time in the future; null or "" mean never.'
_ROLE_IDS = (
    f"Custom or system roles of this organization, by ID: at most {MAX_ROLE_IDS} roles, "
    "those named in roles included."
)
_DEVELOPER = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"  # the system role's fixed ID (schema.sql)
_ACTOR = {"type": "string", "pattern": f"^apiKey/{UUID_TEXT}$"}
_ACTORS = (
    "The keys that hold the role, as apiKey/<key UUID> of keys in this organization; a key "
    f"holds at most {MAX_ROLE_IDS} roles (409 past it)."
)
_ROLE_PERMISSIONS = (
    f"At most {s.MAX_PERMISSIONS} entries here and in every policy's permissions together."
)


def tighten(schemas: dict[str, Any]) -> None:
    """Add the rules the request schemas check in Python functions, which apispec cannot see."""
    for name in ("ApiKeyPostRequest", "ApiKeyPatchRequest", "RoleCreateRequest",
                 "RoleUpdateRequest"):  # fmt: skip
        schemas[name]["properties"]["name"].update(NAME_RULE)
    for name in ("ApiKeyPostRequest", "ApiKeyPatchRequest"):
        properties = schemas[name]["properties"]
        properties["expireAt"].update(description=_EXPIRE_AT, examples=["2099-12-31T23:59:59Z"])
        properties["assignedRoleIds"].update(description=_ROLE_IDS, examples=[[_DEVELOPER]])
    with_roles = {"required": ["roles"], "properties": {"roles": {"minItems": 1}}}
    with_ids = {"required": ["assignedRoleIds"], "properties": {"assignedRoleIds": {"minItems": 1}}}
    schemas["ApiKeyPostRequest"]["anyOf"] = [with_roles, with_ids]
    schemas["ApiKeyPostRequest"]["description"] = _ONE_ROLE
    # A PATCH need not touch the roles; when it does, they replace, and must not be empty.
    untouched = {"not": {"anyOf": [{"required": ["roles"]}, {"required": ["assignedRoleIds"]}]}}
    schemas["ApiKeyPatchRequest"]["anyOf"] = [untouched, with_roles, with_ids]
    schemas["ApiKeyPatchRequest"]["description"] = "Only the fields given change. " + _ONE_ROLE
    hash_data = schemas["ApiKeyHashData"]["properties"]
    hash_data["keyIdHash"].update(_SHA256_B64)
    hash_data["keySecretHash"].update(_SHA256_B64)
    hash_data["keyIdSuffix"]["pattern"] = f"^[^{_CC}]{{{SUFFIX_LENGTH}}}$"
    entry = schemas["IpAccessListEntry"]["properties"]
    entry["source"].update(
        description="An IPv4 or IPv6 address or CIDR, host bits clear.",
        examples=["192.0.2.0/24", "2001:db8::1"],
    )
    entry["description"]["pattern"] = f"^[^{_HIDDEN}]*$"
    for name in ("RoleCreateRequest", "RoleUpdateRequest"):
        properties = schemas[name]["properties"]
        properties["permissions"]["items"] = dict(PERMISSION_RULE)
        properties["actors"]["items"] = dict(_ACTOR)
        properties["actors"]["description"] = _ACTORS
        for field in ("permissions", "policies"):
            properties[field]["description"] = " ".join(
                filter(None, (properties[field].get("description"), _ROLE_PERMISSIONS))
            )
    verifydoc.tighten(schemas, NAME_RULE)
    policy = schemas["RBACPolicyCreateRequest"]["properties"]
    policy["allowDeny"]["not"] = {"const": "DENY"}
    policy["permissions"]["items"] = dict(PERMISSION_RULE)
    policy["resources"].update(
        minItems=1, maxItems=1, description='keysvc grants on every resource: ["*"].'
    )
    policy["resources"]["items"]["enum"] = ["*"]
    # Inline rather than a $ref with siblings, which generators skip: the same properties,
    # none of which keysvc accepts.
    policy["tags"] = {
        **schemas["RBACPolicyTags"],
        "maxProperties": 0,
        "description": "keysvc has no database grants: only {} is accepted.",
    }
