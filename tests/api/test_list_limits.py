"""Request lists: every one has a maximum length, checked before any of its entries and
stated in the OpenAPI document, so a long list of bad entries costs what a short one does;
and a caller who may not change a key is refused before its body is read entry by entry."""

import json
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from marshmallow import Schema, fields, validate

from keysvc.domain.keys import STRONGER_KEY
from keysvc.domain.roles import STRONGER_ROLE, SYSTEM
from keysvc.http import role_schemas, schemas
from tests.helpers import (
    ENTRIES,
    Client,
    Creds,
    assert_error,
    assert_ok,
    create,
    create_creds,
    create_role,
)

REQUEST_SCHEMAS = {
    "ApiKeyPostRequest": schemas.CreateKeySchema(now=datetime.now(UTC)),
    "ApiKeyPatchRequest": schemas.PatchKeySchema(now=datetime.now(UTC)),
    "RoleCreateRequest": role_schemas.CreateRoleSchema(),
    "RoleUpdateRequest": role_schemas.UpdateRoleSchema(),
}
MAX_GRANTS = 100
POLICY = {"allowDeny": "ALLOW", "permissions": ["reports:read"], "resources": ["*"]}


def _lists(schema: Schema, path: str = "") -> list[tuple[str, fields.Field[Any]]]:
    """Every list field of ``schema`` and of the schemas nested in it, by dotted path."""
    found: list[tuple[str, fields.Field[Any]]] = []
    for name, field in schema.fields.items():
        where = f"{path}{name}"
        inner = field.inner if isinstance(field, fields.List) else field
        if isinstance(field, fields.List):
            found.append((where, field))
        if isinstance(inner, fields.Nested) and isinstance(inner.schema, Schema):
            found.extend(_lists(inner.schema, f"{where}[]." if inner is not field else f"{where}."))
    return found


def test_every_request_list_is_bounded_before_its_entries() -> None:
    lists = [item for schema in REQUEST_SCHEMAS.values() for item in _lists(schema)]
    assert {"roles", "policies[].permissions", "policies[].resources",
            "policies[].tags.grants"} <= {where for where, _ in lists}  # fmt: skip
    for where, field in lists:
        assert isinstance(field, schemas.BoundedList), f"{where}: not a BoundedList"
        maxima = [v.max for v in field.validators if isinstance(v, validate.Length)]
        assert any(m is not None for m in maxima), f"{where}: no maximum length"


async def test_every_request_array_has_max_items_in_the_document(client: Client) -> None:
    response = await client.get("/v1/openapi.json")
    document: dict[str, Any] = await response.json()
    components = document["components"]["schemas"]
    unbounded: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                walk(components[node["$ref"].rsplit("/", 1)[-1]], where)
            if node.get("type") == "array" and "maxItems" not in node:
                unbounded.append(where)
            for name, inner in node.get("properties", {}).items():
                walk(inner, f"{where}.{name}")
            if "items" in node:
                walk(node["items"], f"{where}[]")

    for name in REQUEST_SCHEMAS:
        walk(components[name], name)
    assert unbounded == []
    patch = components["ApiKeyPatchRequest"]["properties"]
    assert patch["roles"]["maxItems"] == len(schemas.LEGACY_ROLES)
    policy = components["RBACPolicyCreateRequest"]["properties"]
    assert policy["tags"]["properties"]["grants"]["maxItems"] == MAX_GRANTS


def _long(endpoint: str, admin: Creds, key_id: str, role_id: str, entries: int) -> tuple[
    str, str, dict[str, Any], str
]:  # fmt: skip
    """(method, URL, body, answer) of a body whose list holds ``entries`` bad entries."""
    org = f"/v1/organizations/{admin.organization_id}"
    bad = ["x"] * entries
    policy = [{**POLICY, "resources": bad}]
    tags = [{**POLICY, "tags": {"grants": bad}}]
    one = "must be one of: admin, developer, query_endpoints"
    over = f"must have at most {len(schemas.LEGACY_ROLES)} entries"
    star = 'keysvc grants permissions on every resource: use ["*"]'
    if entries == 1:
        roles_answer, tags_answer = f"roles.0: {one}", "policies.0.tags: are not supported"
    else:
        roles_answer = f"roles: {over}"
        tags_answer = f"policies.0.tags.grants: must have at most {MAX_GRANTS} entries"
    return {
        "create-key": ("POST", f"{org}/keys", {"name": "k", "roles": bad}, roles_answer),
        "patch-key": ("PATCH", f"{org}/keys/{key_id}", {"roles": bad}, roles_answer),
        "resources": ("PATCH", f"{org}/roles/{role_id}", {"policies": policy},
                      f"policies.0.resources: {star}"),
        "grants": ("POST", f"{org}/roles", {"name": "r", "policies": tags}, tags_answer),
    }[endpoint]  # fmt: skip


LONG_LISTS = ["create-key", "patch-key", "resources", "grants"]


async def _targets(client: Client, admin: Creds) -> tuple[str, str]:
    key = await create(client, admin, {"name": "target", "roles": ["developer"]})
    role = await create_role(client, admin, {"name": "target", "permissions": ["reports:read"]})
    return key["key"]["id"], role["id"]


@pytest.mark.parametrize("endpoint", LONG_LISTS)
async def test_a_long_list_gets_one_message_naming_its_limit(
    client: Client, admin: Creds, endpoint: str
) -> None:
    key_id, role_id = await _targets(client, admin)
    method, url, body, answer = _long(endpoint, admin, key_id, role_id, ENTRIES)
    response = await client.request(method, url, json=body, headers=admin.headers)
    error = await assert_error_prefix(response, answer)
    assert "more" not in error


async def assert_error_prefix(response: Any, prefix: str) -> str:
    body = await response.json()
    assert response.status == 400, body
    error: str = body["error"]
    assert error.startswith(prefix), error
    return error


def _cpu_of(client: Client, method: str, url: str, payload: bytes, headers: Any) -> Any:
    async def refuse() -> float:
        """CPU seconds this process (client and server alike) spends on one refusal:
        other processes on a busy machine do not count."""
        started = time.process_time()
        response = await client.request(method, url, data=payload, headers=headers)
        await response.read()
        spent = time.process_time() - started
        assert response.status == 400
        return spent

    return refuse


@pytest.mark.parametrize("endpoint", LONG_LISTS)
async def test_refusing_a_long_list_costs_what_a_short_one_does(
    client: Client, admin: Creds, endpoint: str
) -> None:
    key_id, role_id = await _targets(client, admin)
    headers = {**admin.headers, "Content-Type": "application/json"}
    measures = {}
    for entries in (1, ENTRIES):
        method, url, body, _ = _long(endpoint, admin, key_id, role_id, entries)
        measures[entries] = _cpu_of(client, method, url, json.dumps(body).encode(), headers)
    spent: dict[int, list[float]] = {1: [], ENTRIES: []}
    for _ in range(15):  # interleaved, so that both see the same machine
        for entries, refuse in measures.items():
            spent[entries].append(await refuse())
    short, long = (statistics.median(spent[n]) for n in (1, ENTRIES))
    # The long body is some 40 KB more to receive and parse, and nothing more.
    assert long < 4 * short + 0.002, (short, long)


async def test_a_key_that_may_not_change_the_target_is_refused_before_its_body(
    client: Client, admin: Creds
) -> None:
    weak = await create_creds(client, admin, {"name": "weak", "roles": ["developer"]})
    key_id, role_id = await _targets(client, admin)
    org = f"/v1/organizations/{admin.organization_id}"
    bad = {"roles": ["x"] * ENTRIES, "name": ""}
    # developer lacks keys:update: that was always answered first.
    response = await client.patch(f"{org}/keys/{admin.id}", json=bad, headers=weak.headers)
    await assert_error(response, 403, "this key lacks the permission keys:update")
    updater_role = await create_role(
        client,
        admin,
        {"name": "updater", "permissions": ["keys:update", "keys:read", "roles:read"]},
    )
    updater = await create_creds(
        client, admin, {"name": "updater", "assignedRoleIds": [updater_role["id"]]}
    )
    # A stronger target, itself, or no such key: none needs the body to answer.
    response = await client.patch(f"{org}/keys/{admin.id}", json=bad, headers=updater.headers)
    await assert_error(response, 403, STRONGER_KEY)
    response = await client.patch(f"{org}/keys/{updater.id}", json=bad, headers=updater.headers)
    await assert_error(
        response, 403, "a key cannot change its own roles: use another key to change it"
    )
    missing = "00000000-0000-4000-8000-000000000000"
    response = await client.patch(f"{org}/keys/{missing}", json=bad, headers=updater.headers)
    await assert_error(response, 404, "key not found in this organization")
    # A target it may change: then the body is read, and refused.
    response = await client.patch(f"{org}/keys/{key_id}", json=bad, headers=updater.headers)
    await assert_error(
        response, 400, "name: must be 1 to 255 characters; roles: must have at most 3 entries"
    )
    # Nothing changed on the way.
    target = await assert_ok(await client.get(f"{org}/keys/{key_id}", headers=admin.headers))
    assert target["name"] == "target"
    # A system role, or no such role, is answered before the role body is read.
    bad_role = {"policies": [{**POLICY, "resources": ["x"] * ENTRIES}], "name": ""}
    developer = "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000002"
    response = await client.patch(f"{org}/roles/{developer}", json=bad_role, headers=admin.headers)
    await assert_error(response, 403, SYSTEM)
    response = await client.patch(f"{org}/roles/{missing}", json=bad_role, headers=admin.headers)
    await assert_error(response, 404, "role not found in this organization")
    response = await client.patch(f"{org}/roles/{role_id}", json=bad_role, headers=admin.headers)
    assert response.status == 400
    # A role holding a permission the caller lacks: refused whatever the body says.
    role_writer_role = await create_role(
        client, admin, {"name": "role writer", "permissions": ["roles:write", "roles:read"]}
    )
    role_writer = await create_creds(
        client, admin, {"name": "role writer", "assignedRoleIds": [role_writer_role["id"]]}
    )
    response = await client.patch(
        f"{org}/roles/{role_id}", json=bad_role, headers=role_writer.headers
    )
    await assert_error(response, 403, STRONGER_ROLE)
