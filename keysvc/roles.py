"""Custom roles: what a role body grants, and who may grant it.

A role's permissions come from keysvc's flat ``permissions`` and from the
upstream ``policies`` (ALLOW only), merged. Nobody can create or widen a
role beyond the permissions their own key holds, and assigning a role to
keys through ``actors`` also needs ``keys:update``. As with keys, nobody can
change or delete a role holding a permission they lack, nor give it to or take
it from a key stronger than themselves. System roles never change.
"""

import base64
import binascii
import hmac
from datetime import datetime
from typing import Any

from keysvc.credentials import Hasher
from keysvc.db.roles import RoleCheck
from keysvc.db.store import Store
from keysvc.errors import BadRequest, Forbidden, NotFound
from keysvc.models import Key, RoleDetail, RolePage
from keysvc.permissions import has_permission, missing
from keysvc.schemas import ACTOR_PREFIX

NOT_FOUND = "role not found in this organization"
SYSTEM = "system roles cannot be changed or deleted"


def _permissions(data: dict[str, Any]) -> list[str] | None:
    if "permissions" not in data and "policies" not in data:
        return None
    merged = list(data.get("permissions") or [])
    for policy in data.get("policies") or []:
        merged.extend(policy["permissions"])
    return list(dict.fromkeys(merged))


def _actors(caller: Key, data: dict[str, Any]) -> list[str] | None:
    if "actors" not in data:
        return None
    if not has_permission(caller.permissions, "keys:update"):
        raise Forbidden("assigning a role to keys needs the permission keys:update")
    return [actor.removeprefix(ACTOR_PREFIX) for actor in data["actors"]]


STRONGER_ROLE = "cannot change this role: it holds a permission this key lacks"
STRONGER_ACTOR = (
    "actors: cannot give this role to or take it from a key that holds a permission this key lacks"
)
OWN_ROLES = "actors: a key cannot change its own roles: use another key to change them"


def _may_change(caller: Key) -> RoleCheck:
    """The check run in the role's write transaction. The caller must hold every
    permission the role holds then, and every permission of each key the write
    changes: those gaining or losing the role, and its holders when its permissions
    change. It may not move the role onto or off itself. The answers name no
    permission: the caller may not be allowed to read the keys or the role."""

    def check(current: RoleDetail | None, moved: set[str], held: frozenset[str]) -> None:
        if caller.id in moved:
            raise Forbidden(OWN_ROLES)
        if (
            current is not None
            and missing(caller.permissions, current.role.permissions) is not None
        ):
            raise Forbidden(STRONGER_ROLE)
        if missing(caller.permissions, sorted(held)) is not None:
            raise Forbidden(STRONGER_ACTOR)

    return check


def _check_grantable(caller: Key, permissions: list[str] | None) -> None:
    lacking = None if permissions is None else missing(caller.permissions, permissions)
    if lacking is not None:
        raise Forbidden(f"cannot grant the permission {lacking}: this key lacks it")


async def create_role(
    store: Store,
    caller: Key,
    organization_id: str,
    data: dict[str, Any],
    now: datetime,
    max_roles: int,
) -> RoleDetail:
    """Store a custom role from a validated body, unless the organization has
    ``max_roles`` already (counted in the create's transaction)."""
    permissions = _permissions(data) or []
    _check_grantable(caller, permissions)
    actors = _actors(caller, data) or []
    return await store.roles.create_role(
        organization_id,
        data["name"],
        permissions,
        actors,
        now,
        _may_change(caller),
        max_roles=max_roles,
    )


async def changeable_role(store: Store, organization_id: str, role_id: str) -> RoleDetail:
    """The custom role a PATCH would change: read before the body is validated, so that
    no such role (404) and a system role (403) are answered without reading it. What the
    caller may change depends on the body: checked once it is valid, and again in the
    write's transaction."""
    return await _custom_role(store, organization_id, role_id)


async def update_role(
    store: Store,
    caller: Key,
    current: RoleDetail,
    data: dict[str, Any],
    now: datetime,
) -> RoleDetail:
    """Apply a validated PATCH body to ``current``, as ``changeable_role`` returned it."""
    organization_id, role_id = current.organization_id, current.role.id
    permissions = _permissions(data)
    actors = _actors(caller, data)
    # Handing the role to keys grants what it holds, so that needs holding too.
    effective = list(current.role.permissions) if permissions is None else permissions
    _check_grantable(caller, effective if actors is not None else permissions)
    updated = await store.roles.update_role(
        organization_id, role_id, now, data.get("name"), permissions, actors, _may_change(caller)
    )
    if updated is None:
        raise NotFound(NOT_FOUND)
    return updated


async def delete_role(store: Store, caller: Key, organization_id: str, role_id: str) -> None:
    await _custom_role(store, organization_id, role_id)
    if not await store.roles.delete_role(organization_id, role_id, _may_change(caller)):
        raise NotFound(NOT_FOUND)


async def _custom_role(store: Store, organization_id: str, role_id: str) -> RoleDetail:
    detail = await store.roles.get_role(organization_id, role_id)
    if detail is None:
        raise NotFound(NOT_FOUND)
    if detail.role.type == "system":
        raise Forbidden(SYSTEM)
    return detail


# The start of the list: before every role, system (0) or custom (1).
START = (-1, "")
BAD_CURSOR = "cursor: not a cursor from this list; start again without it"
_CURSOR = "role cursor"


def encode_cursor(hasher: Hasher, organization_id: str, detail: RoleDetail) -> str:
    """An opaque cursor after ``detail``'s role, valid only for this organization's list:
    its position (custom or not, then its name) in base64, and a MAC of that."""
    kind = "c" if detail.role.type == "custom" else "s"
    text = base64.urlsafe_b64encode(f"{kind}{detail.role.name}".encode()).decode().rstrip("=")
    return f"{text}.{hasher.sign(_CURSOR, f'{organization_id}:{text}')}"


def decode_cursor(hasher: Hasher, organization_id: str, cursor: str | None) -> tuple[int, str]:
    """The position a cursor stands for; START for none. A forged or foreign cursor is a 400."""
    if cursor is None:
        return START
    text, _, mac = cursor.partition(".")
    expected = hasher.sign(_CURSOR, f"{organization_id}:{text}")
    if not hmac.compare_digest(expected.encode(), mac.encode()):
        raise BadRequest(BAD_CURSOR)
    try:  # signed by this server, so well formed; checked all the same
        position = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise BadRequest(BAD_CURSOR) from None
    return int(position[:1] == "c"), position[1:]


def next_cursor(hasher: Hasher, organization_id: str, page: RolePage) -> str | None:
    return encode_cursor(hasher, organization_id, page.roles[-1]) if page.more else None
