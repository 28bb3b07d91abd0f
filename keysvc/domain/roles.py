"""Custom roles: what a role body grants, and who may grant it.

A role's permissions are keysvc's flat ``permissions`` merged with the upstream
``policies`` (ALLOW only). Nobody creates or widens a role beyond their own key's
permissions, assigns it through ``actors`` without ``keys:update``, or changes,
deletes, gives or takes a role holding a permission they lack; system roles never
change. Each write reads, checks and writes in one ``Store.transaction`` (SQL in
``keysvc.db.roles``), recording its activity and, for each key given or relieved of
the role, that key's activity and ``key.updated`` event. A PATCH that changes
nothing writes, records and sends nothing.
"""

import base64
import binascii
import hmac
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from keysvc.credentials import Hasher
from keysvc.db import keys as key_sql
from keysvc.db import roles as role_sql
from keysvc.db.contract import Connection, Store
from keysvc.db.statements import settle, tentatively
from keysvc.domain import activities, keys
from keysvc.domain.limits import ACTOR_PREFIX, MAX_ROLE_IDS
from keysvc.domain.permissions import has_permission, missing
from keysvc.errors import BadRequest, Conflict, Forbidden, NotFound
from keysvc.models import Actor, Key, Role, RoleDetail, RolePage

NOT_FOUND = "role not found in this organization"
SYSTEM = "system roles cannot be changed or deleted"
# The name sent is not repeated: an answer never echoes what the caller gave.
ROLE_NAME_TAKEN = "name: a role with this name already exists in this organization; choose another"

# Called inside a role's write transaction, before it writes, with: the role as it is
# then (None on create); the IDs of the keys that would gain or lose it; and every
# permission held by the keys whose permissions the write changes (those, and the
# role's holders when its permissions change). Refuses by raising.
RoleCheck = Callable[[RoleDetail | None, set[str], frozenset[str]], None]


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
    actor: Actor,
) -> RoleDetail:
    """Store a custom role from a validated body, unless the organization has
    ``max_roles`` already (counted in the create's transaction)."""
    permissions = _permissions(data) or []
    _check_grantable(caller, permissions)
    actors = _actors(caller, data) or []
    return await _insert_role(
        store,
        organization_id,
        data["name"],
        permissions,
        actors,
        now,
        _may_change(caller),
        max_roles=max_roles,
        actor=actor,
    )


async def _insert_role(
    store: Store,
    organization_id: str,
    name: str,
    permissions: Sequence[str],
    actors: Sequence[str],
    now: datetime,
    check: RoleCheck,
    *,
    max_roles: int,
    actor: Actor = activities.SYSTEM,
) -> RoleDetail:
    """A new custom role, unless the organization holds ``max_roles`` already: checked,
    counted and written in one transaction."""
    role = Role(str(uuid.uuid4()), name, "custom", tuple(permissions), now, now)
    async with store.transaction("create_role") as conn:
        moved = set(actors)
        check(None, moved, await role_sql.permissions_of_keys(conn, organization_id, moved))
        if await role_sql.count_custom_roles(conn, organization_id) >= max_roles:
            raise Conflict(
                f"this organization has reached its limit of {max_roles} custom roles;"
                " delete one it no longer needs"
            )
        await _check_name(conn, organization_id, name)
        given = await _keys(conn, organization_id, moved)
        await role_sql.insert_role(conn, organization_id, role)
        await _set_actors(conn, organization_id, role.id, actors)
        if actors:
            await store.authorization_changed(conn)
        detail = await role_sql.get_role(conn, organization_id, role.id)
        assert detail is not None
        await store.record(conn, activities.role_created(detail, actor, now))
        await _announce_moved(store, conn, given, actor, now)
    return detail


async def changeable_role(
    store: Store, caller: Key, organization_id: str, role_id: str
) -> RoleDetail:
    """The custom role a PATCH would change: read before the body is validated, so that
    no such role (404), a system role (403) and a role holding a permission the caller
    lacks (403, whatever the body) are answered without reading it. What else the
    caller may change depends on the body: checked once it is valid, and all of it
    again in the write's transaction."""
    current = await _custom_role(store, organization_id, role_id)
    if missing(caller.permissions, current.role.permissions) is not None:
        raise Forbidden(STRONGER_ROLE)
    return current


async def update_role(
    store: Store,
    caller: Key,
    current: RoleDetail,
    data: dict[str, Any],
    now: datetime,
    actor: Actor,
) -> RoleDetail:
    """Apply a validated PATCH body to ``current``, as ``changeable_role`` returned it."""
    organization_id, role_id = current.organization_id, current.role.id
    permissions = _permissions(data)
    actors = _actors(caller, data)
    # Handing the role to keys grants what it holds, so that needs holding too.
    effective = list(current.role.permissions) if permissions is None else permissions
    _check_grantable(caller, effective if actors is not None else permissions)
    updated = await change_role(
        store,
        organization_id,
        role_id,
        now,
        data.get("name"),
        permissions,
        actors,
        _may_change(caller),
        actor,
    )
    if updated is None:
        raise NotFound(NOT_FOUND)
    return updated


async def change_role(
    store: Store,
    organization_id: str,
    role_id: str,
    now: datetime,
    name: str | None = None,
    permissions: Sequence[str] | None = None,
    actors: Sequence[str] | None = None,
    check: RoleCheck | None = None,
    actor: Actor = activities.SYSTEM,
) -> RoleDetail | None:
    """Change a custom role of this organization in one transaction, ``check`` passing
    first there; None if there is no such role. What changed is recorded as ``actor``'s
    activity; a change to nothing records none."""
    async with store.transaction("update_role") as conn:
        current = await role_sql.get_role(conn, organization_id, role_id)
        if current is None or current.role.type != "custom":
            return None
        if check is not None:
            moved = set() if actors is None else set(current.actors) ^ set(actors)
            affected = set(moved)
            if permissions is not None and set(permissions) != set(current.role.permissions):
                affected.update(current.actors)
            held = await role_sql.permissions_of_keys(conn, organization_id, affected)
            check(current, moved, held)
        if name is not None and name != current.role.name:
            await _check_name(conn, organization_id, name)
        changed = replace(
            current.role,
            name=name or current.role.name,
            permissions=current.role.permissions if permissions is None else tuple(permissions),
            updated_at=now,
        )
        shifted = await _keys(conn, organization_id, set(current.actors) ^ set(actors or ()))
        await tentatively(conn)
        await role_sql.update_role(conn, changed)
        if actors is not None:
            await _set_actors(conn, organization_id, role_id, actors)
        updated = await role_sql.get_role(conn, organization_id, role_id)
        logged = None if updated is None else activities.role_changed(current, updated, actor, now)
        await settle(conn, keep=logged is not None)
        if updated is None or logged is None:
            return current
        await store.authorization_changed(conn)
        await store.record(conn, logged)
        await _announce_moved(store, conn, shifted, actor, now)
        return updated


async def delete_role(
    store: Store, caller: Key, organization_id: str, role_id: str, now: datetime, actor: Actor
) -> None:
    """Delete a custom role that no key holds, the caller holding all it holds."""
    await _custom_role(store, organization_id, role_id)
    check = _may_change(caller)
    async with store.transaction("delete_role") as conn:
        current = await role_sql.get_role(conn, organization_id, role_id)
        deleted = current is not None and current.role.type == "custom"
        if current is not None and deleted:
            check(current, set(), frozenset())
            holders = await role_sql.count_holders(conn, role_id)
            if holders:
                raise Conflict(f"role is assigned to {holders} key(s); unassign it first")
            await role_sql.delete_role(conn, role_id)
            await store.authorization_changed(conn)
            await store.record(conn, activities.role_deleted(current, actor, now))
    if not deleted:
        raise NotFound(NOT_FOUND)


async def _check_name(conn: Connection, organization_id: str, name: str) -> None:
    if await role_sql.name_taken(conn, organization_id, name):
        raise Conflict(ROLE_NAME_TAKEN)


async def _set_actors(
    conn: Connection, organization_id: str, role_id: str, key_ids: Sequence[str]
) -> None:
    """Make exactly ``key_ids`` hold the role; no key may be left without a role, nor
    given more than MAX_ROLE_IDS, the most a create or PATCH of a key may give it."""
    wanted = list(dict.fromkeys(key_ids))
    missing_keys = set(wanted) - await role_sql.keys_in_organization(conn, organization_id, wanted)
    if missing_keys:
        raise BadRequest(f"actors: no key {sorted(missing_keys)[0]} in this organization")
    stranded = await role_sql.stranded_key(conn, role_id, wanted)
    if stranded is not None:
        raise Conflict(f"actors: key {stranded} would be left with no role")
    full = await role_sql.key_with_roles_besides(conn, wanted, role_id, MAX_ROLE_IDS)
    if full is not None:
        raise Conflict(
            f"actors: key {full} already holds {MAX_ROLE_IDS} roles, the most"
            " a key may hold; take one from it first"
        )
    await role_sql.set_actors(conn, role_id, wanted)


async def _keys(conn: Connection, organization_id: str, key_ids: set[str]) -> list[Key]:
    """The keys of ``key_ids`` as they are now, oldest first; those not in the
    organization left out (``_set_actors`` refuses them)."""
    found = [await key_sql.get_key(conn, organization_id, key_id) for key_id in key_ids]
    return sorted((key for key in found if key is not None), key=lambda key: key.seq)


async def _announce_moved(
    store: Store, conn: Connection, moved: list[Key], actor: Actor, now: datetime
) -> None:
    """Each key given or relieved of a role through its ``actors``, as it was before:
    its role-changed activity and ``key.updated`` event, as a PATCH of the key sends."""
    for before in moved:
        after = await key_sql.get_key(conn, before.organization_id, before.id)
        if after is not None:
            logged = activities.key_changed(before, after, actor, now)
            await keys.announce_change(store, conn, after, logged, now)


async def get_role(store: Store, organization_id: str, role_id: str) -> RoleDetail:
    """The role with its holders, or 404."""
    detail = await store.roles.get_role(organization_id, role_id)
    if detail is None:
        raise NotFound(NOT_FOUND)
    return detail


async def list_roles(
    store: Store, organization_id: str, after: tuple[int, str], limit: int
) -> RolePage:
    """System roles first, then custom ones, each by name, after ``after``
    (``decode_cursor``)."""
    return await store.roles.list_roles(organization_id, after, limit)


async def _custom_role(store: Store, organization_id: str, role_id: str) -> RoleDetail:
    detail = await get_role(store, organization_id, role_id)
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
