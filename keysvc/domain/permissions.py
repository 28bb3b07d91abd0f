"""Permission strings and the one rule that matches them.

A permission is ``namespace:action`` (the action may hold further colons, as
in ``control-plane:organization:view``). ``namespace:*`` grants every action
of a namespace, and ``*`` grants everything. The management API uses the
``keys``, ``roles``, ``webhooks`` and ``identities`` namespaces (``MANAGEMENT``, the catalogue of
what its routes ask for), and ``activities:read`` for the activity log; any other
namespace belongs to the services behind keysvc.
"""

import re
from collections.abc import Iterable

PERMISSION = re.compile(r"\*|[a-z0-9][a-z0-9_.-]*:(\*|[a-z0-9][a-z0-9_.:-]*)")
MAX_PERMISSION_LENGTH = 128
# Every permission the management API's routes need (keysvc.http.routes); admin holds
# them all through ``*``.
MANAGEMENT = (
    "keys:read", "keys:create", "keys:update", "keys:delete",
    "roles:read", "roles:write",
    "activities:read",
    "webhooks:read", "webhooks:write",
    "identities:read", "identities:write",
)  # fmt: skip


def has_permission(granted: Iterable[str], needed: str) -> bool:
    """Whether ``granted`` holds ``needed`` itself, ``*``, or its namespace's ``ns:*``:
    three set lookups (a key's permissions are a frozenset already)."""
    held = granted if isinstance(granted, (set, frozenset)) else frozenset(granted)
    return needed in held or "*" in held or f"{needed.partition(':')[0]}:*" in held


def missing(granted: Iterable[str], wanted: Iterable[str]) -> str | None:
    """The first of ``wanted`` that ``granted`` does not cover, if any."""
    held = frozenset(granted)
    return next((p for p in wanted if not has_permission(held, p)), None)


def cannot_grant(
    granted: Iterable[str], role_name: str, role_permissions: Iterable[str]
) -> str | None:
    """Why a key holding ``granted`` may not give a key the role ``role_name``, if it
    may not: the first of the role's permissions it lacks, named."""
    lacking = missing(granted, role_permissions)
    if lacking is None:
        return None
    return f"cannot grant role {role_name}: this key lacks the permission {lacking}"
