"""The live tables checked against the activity log, for ``keysvc audit verify``: each
organization's chain replayed into the keys and custom roles its records leave, and
every key and custom role that exists compared with that.

A chain that holds proves its records were not edited or removed; it does not prove
that the tables say what the records say. A key written straight into ``api_keys``
(a new admin key, say), with the records since a saved head removed and that head
put back, leaves a chain that holds. The replay catches it: that key has no
``key_create`` record.

Compared: a key's name, state, expireAt, IP access list, rate limit and roles, and
its key ID suffix once a rotation recorded one; a custom role's name and
permissions. Not compared: usedAt (not recorded) and the credential hashes (never
recorded). Keys and custom roles that existed before the log began are recorded
by its seal (``Store.key_activities``), as creates by ``system``, so they replay too.
"""

import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from keysvc.timeutil import from_text, to_text

_RECORDS = """
    select organization_id, type, target_key_id, target_role_id, after
    from activities order by organization_id, org_seq
"""
_KEYS = """
    select id, organization_id, name, state, expire_at, ip_access_list, rate_limit,
           rate_window, key_suffix
    from api_keys order by organization_id, org_seq
"""
_KEY_ROLES = "select key_id, role_id from key_roles"
# What the records a retention pruned left, per organization (keysvc.db.retention).
_ANCHOR_STATES = "select state from activity_anchors order by organization_id"
_CUSTOM_ROLES = """
    select id, organization_id, name, permissions from roles
    where type = 'custom' order by organization_id, name
"""
_ACTOR_PREFIX = "apiKey/"
_KEY_FIELDS = ("name", "state", "expireAt", "ipAccessList", "rateLimit", "assignedRoles")


@dataclass
class _Key:
    organization_id: str
    values: dict[str, Any]  # _KEY_FIELDS, assignedRoles as a set of role IDs
    suffix: str | None = None  # known once a rotation recorded it


@dataclass
class _Replay:
    keys: dict[str, _Key] = field(default_factory=dict)
    roles: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)


def _key_values(view: dict[str, Any]) -> dict[str, Any]:
    values = {name: view.get(name) for name in _KEY_FIELDS}
    values["assignedRoles"] = {r["roleId"] for r in view.get("assignedRoles") or ()}
    if values["expireAt"] is not None:
        values["expireAt"] = from_text(values["expireAt"])
    return values


def _role_values(view: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "name" in view:
        values["name"] = view["name"]
    if "permissions" in view:
        values["permissions"] = set(view["permissions"])
    return values


def _hold(replay: _Replay, role_id: str, actors: Iterable[str], organization_id: str) -> None:
    """The keys of ``actors`` hold the role; the organization's other keys do not."""
    holders = {actor.removeprefix(_ACTOR_PREFIX) for actor in actors}
    for key_id, key in replay.keys.items():
        if key.organization_id == organization_id:
            roles = key.values["assignedRoles"]
            (roles.add if key_id in holders else roles.discard)(role_id)


def restore(state: dict[str, Any]) -> _Replay:
    """The replay a pruned chain's anchor saved (``save``), to go on from."""
    made = _Replay()
    for key_id, (org, values, suffix) in state["keys"].items():
        values = dict(values, assignedRoles=set(values["assignedRoles"]))
        if values["expireAt"] is not None:
            values["expireAt"] = from_text(values["expireAt"])
        made.keys[key_id] = _Key(org, values, suffix)
    for role_id, (org, values) in state["roles"].items():
        if "permissions" in values:
            values = dict(values, permissions=set(values["permissions"]))
        made.roles[role_id] = (org, values)
    return made


def save(replay: _Replay) -> dict[str, Any]:
    """``replay`` as JSON values (``restore`` reads them back)."""
    keys = {}
    for key_id, key in replay.keys.items():
        values = dict(key.values, assignedRoles=sorted(key.values["assignedRoles"]))
        if values["expireAt"] is not None:
            values["expireAt"] = to_text(values["expireAt"], fraction=True)
        keys[key_id] = [key.organization_id, values, key.suffix]
    roles = {}
    for role_id, (org, values) in replay.roles.items():
        if "permissions" in values:
            values = dict(values, permissions=sorted(values["permissions"]))
        roles[role_id] = [org, values]
    return {"keys": keys, "roles": roles}


def apply(replay: _Replay, row: sqlite3.Row | tuple[Any, ...]) -> None:
    """``replay`` after the record ``row`` (``_RECORDS``' columns)."""
    org, kind, key_id, role_id, after_text = row
    after: dict[str, Any] = {} if after_text is None else json.loads(after_text)
    if kind == "key_create":
        replay.keys[key_id] = _Key(org, _key_values(after))
    elif kind == "key_delete":
        replay.keys.pop(key_id, None)
    elif kind == "openapi_key_update" and key_id in replay.keys:
        key = replay.keys[key_id]
        if "keySuffix" in after:
            key.suffix = after["keySuffix"]
        changed = _key_values(after)
        key.values.update({name: changed[name] for name in _KEY_FIELDS if name in after})
    elif kind == "key_import":  # a batch of keys, each recorded as a create records it
        for view in after["keys"]:
            replay.keys[view["id"]] = _Key(org, _key_values(view))
    elif kind == "key_leaked":
        pass  # a report only: a disable it made is recorded as its own openapi_key_update
    elif kind == "role_create":
        replay.roles[role_id] = (org, _role_values(after))
        if after.get("actors"):  # a new role has no holders but these
            _hold(replay, role_id, after["actors"], org)
    elif kind == "role_update" and role_id in replay.roles:
        replay.roles[role_id][1].update(_role_values(after))
        if "actors" in after:
            _hold(replay, role_id, after["actors"], org)
    elif kind == "role_delete":
        replay.roles.pop(role_id, None)
        for key in replay.keys.values():
            key.values["assignedRoles"].discard(role_id)


def _live_keys(conn: sqlite3.Connection) -> dict[str, _Key]:
    roles: dict[str, set[str]] = {}
    for key_id, role_id in conn.execute(_KEY_ROLES):
        roles.setdefault(key_id, set()).add(role_id)
    live: dict[str, _Key] = {}
    for row in conn.execute(_KEYS):
        key_id, org, name, state, expire_at, ip_list, limit, window, suffix = row
        values = {
            "name": name,
            "state": state,
            "expireAt": None if expire_at is None else from_text(expire_at),
            "ipAccessList": json.loads(ip_list),
            "rateLimit": None if limit is None else {"limit": limit, "windowSeconds": window},
            "assignedRoles": roles.get(key_id, set()),
        }
        live[key_id] = _Key(org, values, suffix)
    return live


def _key_problem(key_id: str, live: _Key, replayed: _Key | None) -> str | None:
    if replayed is None or replayed.organization_id != live.organization_id:
        return f"key {key_id} has no key_create record in its organization"
    for name in _KEY_FIELDS:
        if live.values[name] != replayed.values[name]:
            return f"key {key_id}: {name} differs from its last recorded value"
    if replayed.suffix is not None and replayed.suffix != live.suffix:
        return f"key {key_id}: keySuffix differs from its last recorded value"
    return None


def _role_problem(conn: sqlite3.Connection, replay: _Replay) -> str | None:
    live_ids = set()
    for role_id, org, name, permissions in conn.execute(_CUSTOM_ROLES):
        live_ids.add(role_id)
        replayed = replay.roles.get(role_id)
        if replayed is None or replayed[0] != org:
            return f"role {role_id} has no role_create record in its organization"
        values = {"name": name, "permissions": set(json.loads(permissions))}
        for attribute in ("name", "permissions"):
            if values[attribute] != replayed[1].get(attribute):
                return f"role {role_id}: {attribute} differs from its last recorded value"
    for role_id in sorted(set(replay.roles) - live_ids):
        return f"role {role_id} is gone without a role_delete record"
    return None


def check(conn: sqlite3.Connection) -> str | None:
    """The first key or custom role that is not as its organization's records leave
    it; None when all are. Run in ``verify``'s read transaction, after the chains."""
    replay = _Replay()
    for (state,) in conn.execute(_ANCHOR_STATES):
        pruned = restore(json.loads(state))
        replay.keys.update(pruned.keys)
        replay.roles.update(pruned.roles)
    for row in conn.execute(_RECORDS):
        apply(replay, row)
    live = _live_keys(conn)
    for key_id, key in live.items():
        problem = _key_problem(key_id, key, replay.keys.get(key_id))
        if problem is not None:
            return problem
    for key_id in sorted(set(replay.keys) - set(live)):
        return f"key {key_id} is gone without a key_delete record"
    return _role_problem(conn, replay)
