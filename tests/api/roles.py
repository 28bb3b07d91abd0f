"""What the custom-role tests (tests/api/test_roles_*.py and test_role_limits.py) share:
the system roles, the expected messages and shapes, URLs, and a key holding a new role."""

import re
import uuid
from typing import Any

from tests.helpers import Client, Creds, assert_ok, create_creds, create_role

# The key helpers the role tests import from here live with the others.
from tests.helpers import get_key as get_key
from tests.helpers import keys_url as keys_url

ADMIN_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001"
DEVELOPER_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
QUERY_ROLE = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000003"
SYSTEM_ROLES = [
    (ADMIN_ROLE, "admin", ["*"]),
    (DEVELOPER_ROLE, "developer", ["keys:read", "roles:read"]),
    (QUERY_ROLE, "query_endpoints", ["endpoints:query"]),
]
ROLE_FIELDS = {
    "id", "tenantId", "ownerId", "name", "type", "actors", "policies", "permissions",
    "createdAt", "updatedAt",
}  # fmt: skip
POLICY_FIELDS = {"id", "roleId", "tenantId", "allowDeny", "permissions", "resources", "tags"}
UTC_Z = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z")
MISSING = "00000000-0000-4000-8000-000000000000"
BAD_PERMISSION = "must be *, namespace:* or namespace:action in lowercase, such as reports:read"
SYSTEM = "system roles cannot be changed or deleted"
NOT_FOUND = "role not found in this organization"
NEEDS_KEYS_UPDATE = "assigning a role to keys needs the permission keys:update"
MANAGER = ["keys:update", "keys:create", "keys:read", "roles:write"]


def roles_url(creds: Creds, role: str | None = None) -> str:
    base = f"/v1/organizations/{creds.organization_id}/roles"
    return base if role is None else f"{base}/{role}"


def actor(key_id: str) -> str:
    return f"apiKey/{key_id}"


def allow(*permissions: str, **extra: Any) -> dict[str, Any]:
    return {"allowDeny": "ALLOW", "permissions": list(permissions), "resources": ["*"], **extra}


async def get_role(client: Client, caller: Creds, role_id: str) -> dict[str, Any]:
    result: dict[str, Any] = await assert_ok(
        await client.get(roles_url(caller, role_id), headers=caller.headers)
    )
    return result


async def role_key(
    client: Client, admin: Creds, permissions: list[str], name: str = "custom"
) -> tuple[Creds, dict[str, Any]]:
    """A key whose only role is a new custom role with ``permissions``, made by ``admin``."""
    role = await create_role(client, admin, {"name": name, "permissions": permissions})
    creds = await create_creds(
        client, admin, {"name": f"{name} key", "assignedRoleIds": [role["id"]]}
    )
    return creds, await get_role(client, admin, role["id"])


def check_role_shape(
    role: dict[str, Any], org: str, name: str, kind: str, permissions: list[str]
) -> None:
    assert set(role) == ROLE_FIELDS
    assert uuid.UUID(role["id"])
    assert role["tenantId"] == f"organization/{org}"
    assert role["ownerId"] == f"organization/{org}"
    assert role["name"] == name
    assert role["type"] == kind
    assert role["permissions"] == permissions
    (policy,) = role["policies"]
    assert set(policy) == POLICY_FIELDS
    assert policy["roleId"] == role["id"]
    assert policy["tenantId"] == f"organization/{org}"
    assert policy["allowDeny"] == "ALLOW"
    assert policy["permissions"] == permissions
    assert policy["resources"] == ["*"]
    assert UTC_Z.fullmatch(role["createdAt"])
    assert UTC_Z.fullmatch(role["updatedAt"])
