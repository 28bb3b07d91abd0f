"""The served OpenAPI document: valid, complete, true to upstream and to the service."""

import json
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from keysvc.http.routes import is_public
from tests.helpers import Client, Creds, create, create_creds, hash_data

# The contract as shared with the project, and the copy kept here so the test runs in any
# checkout; where both exist they must be the same document.
SHARED = Path(__file__).resolve().parents[2].parent / "shared/reference/upstream-keys-openapi.json"
VENDORED = Path(__file__).parents[1] / "data" / "upstream-keys-openapi.json"
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
async def document(client: Client) -> dict[str, Any]:
    response = await client.get("/v1/openapi.json")  # no credentials
    assert response.status == 200
    spec: dict[str, Any] = await response.json()
    return spec


def upstream() -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(VENDORED.read_text())
    if SHARED.exists():
        assert json.loads(SHARED.read_text()) == spec, "tests/data's copy is out of date"
    return spec


async def test_document_is_valid_openapi_31(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    validate(document)
    assert document["components"]["securitySchemes"]["basicAuth"] == {
        "type": "http",
        "scheme": "basic",
        "description": "Key ID and key secret.",
    }
    assert document["security"] == [{"basicAuth": []}]


def _resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        node = doc["components"]["schemas"][name]
    return node


def _types(node: dict[str, Any]) -> set[str]:
    kind = node.get("type")
    return set(kind) if isinstance(kind, list) else {kind} if kind else set()


def _compare(up_doc: dict[str, Any], ours_doc: dict[str, Any], up: dict[str, Any],
             ours: dict[str, Any], where: str, drift: list[str]) -> None:  # fmt: skip
    up, ours = _resolve(up_doc, up), _resolve(ours_doc, ours)
    if _types(up) and _types(up) != _types(ours):
        drift.append(f"{where}: type {sorted(_types(up))} != {sorted(_types(ours))}")
    if "format" in up and up["format"] != ours.get("format"):
        drift.append(f"{where}: format {up['format']} != {ours.get('format')}")
    # An enum may grow only by values listed as keysvc's own, after upstream's in order.
    added = ours.get("x-keysvc-enum-additions", [])
    if "enum" in up and up["enum"] + added != ours.get("enum"):
        drift.append(f"{where}: enum {up['enum']} + {added} != {ours.get('enum')}")
    if up.get("deprecated") and not ours.get("deprecated"):
        drift.append(f"{where}: upstream marks it deprecated")
    if "items" in up:
        _compare(up_doc, ours_doc, up["items"], ours.get("items", {}), f"{where}[]", drift)
    up_props, our_props = up.get("properties", {}), ours.get("properties", {})
    for name, prop in up_props.items():
        if name in our_props:
            _compare(up_doc, ours_doc, prop, our_props[name], f"{where}.{name}", drift)
        else:
            drift.append(f"{where}.{name}: missing")
    for name, prop in our_props.items():
        if name not in up_props and up_props and not prop.get("x-keysvc-addition"):
            drift.append(f"{where}.{name}: not upstream and not marked x-keysvc-addition")


def _body_schema(part: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = part["content"]["application/json"]["schema"]
    return schema


async def test_shared_operations_match_upstream(document: dict[str, Any]) -> None:
    up_doc = upstream()
    drift: list[str] = []
    shared = 0
    for path, up_ops in up_doc["paths"].items():
        assert path in document["paths"], f"{path}: not served"
        for method, up_op in up_ops.items():
            ours = document["paths"][path].get(method)
            assert ours is not None, f"{method.upper()} {path}: not served"
            shared += 1
            where = f"{method.upper()} {path}"
            if ours["operationId"] != up_op["operationId"]:
                drift.append(f"{where}: operationId {ours['operationId']}")
            up_params = {(p["in"], p["name"]): p for p in up_op.get("parameters", [])}
            our_params = {(p["in"], p["name"]): p for p in ours.get("parameters", [])}
            for key, param in up_params.items():
                if key not in our_params:
                    drift.append(f"{where}: parameter {key} missing")
                    continue
                if param.get("required") != our_params[key].get("required"):
                    drift.append(f"{where}: parameter {key} required differs")
                _compare(up_doc, document, param["schema"], our_params[key]["schema"],
                         f"{where} {key[1]}", drift)  # fmt: skip
            for key, param in our_params.items():
                if key not in up_params and not param.get("x-keysvc-addition"):
                    drift.append(f"{where}: parameter {key} not upstream nor marked")
            if "requestBody" in up_op:
                _compare(up_doc, document, _body_schema(up_op["requestBody"]),
                         _body_schema(ours["requestBody"]), f"{where} body", drift)  # fmt: skip
            for status, response in up_op["responses"].items():
                assert status in ours["responses"], f"{where}: status {status} undocumented"
                ours_body = _body_schema(ours["responses"][status])
                _compare(up_doc, document, _body_schema(response), ours_body,
                         f"{where} {status}", drift)  # fmt: skip
    assert shared == 12
    assert drift == [], "\n".join(drift)


def test_comparison_catches_drift() -> None:
    """The comparison itself can fail: a renamed field, a changed type and an enum grown
    by a value not listed as keysvc's own are caught."""
    up_doc = {"components": {"schemas": {}}}
    drift: list[str] = []
    up = {"properties": {"keyId": {"type": "string"}, "n": {"type": "number"}}}
    ours = {"properties": {"keyID": {"type": "string"}, "n": {"type": "string"}}}
    _compare(up_doc, up_doc, up, ours, "X", drift)
    assert drift == [
        "X.keyId: missing",
        "X.n: type ['number'] != ['string']",
        "X.keyID: not upstream and not marked x-keysvc-addition",
    ]
    grown: list[str] = []
    _compare(up_doc, up_doc, {"enum": ["a"]}, {"enum": ["a", "b"]}, "E", grown)
    assert grown == ["E: enum ['a'] + [] != ['a', 'b']"]
    listed: list[str] = []
    added = {"enum": ["a", "b"], "x-keysvc-enum-additions": ["b"]}
    _compare(up_doc, up_doc, {"enum": ["a"]}, added, "E", listed)
    assert listed == []


async def test_every_route_is_documented_and_every_operation_served(
    client: Client, document: dict[str, Any]
) -> None:
    served = set()
    any_method = set()
    for route in client.app.router.routes():
        path = route.resource.canonical if route.resource else ""
        if route.method == "*":
            any_method.add(path)
        elif route.method != "HEAD":
            served.add((path, route.method.lower()))
    documented = {(p, m) for p, ops in document["paths"].items() for m in ops if m in METHODS}
    # A route for any method is documented with the methods proxies use.
    assert {(p, m) for p, m in documented if p in any_method} == {
        (p, m) for p in any_method for m in ("get", "post")
    }
    assert served == {(p, m) for p, m in documented if p not in any_method}


async def test_every_authenticated_operation_lists_the_refusals(
    client: Client, document: dict[str, Any]
) -> None:
    """Any authenticated request may be refused for its credentials (401), its key's
    standing (403) or a rate limit (429): each such operation says so."""
    checked = 0
    for route in client.app.router.routes():
        if is_public(route.handler) or route.method == "HEAD" or route.resource is None:
            continue
        methods = ("get", "post") if route.method == "*" else (route.method.lower(),)
        for method in methods:
            responses = document["paths"][route.resource.canonical][method]["responses"]
            assert {"401", "403", "429"} <= set(responses), (route.resource.canonical, method)
            checked += 1
    assert checked >= 10


async def test_deprecated_fields_are_marked(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for name in ("ApiKey", "ApiKeyPostRequest", "ApiKeyPatchRequest"):
        assert schemas[name]["properties"]["roles"]["deprecated"] is True


def _validator(
    document: dict[str, Any], path: str, method: str, status: int
) -> Draft202012Validator:
    schema = _body_schema(document["paths"][path][method]["responses"][str(status)])
    # "#/components/..." resolves against the root, so the root carries the components.
    return Draft202012Validator({**schema, "components": document["components"]})


async def test_real_responses_match_the_document(
    client: Client, admin: Creds, document: dict[str, Any]
) -> None:
    """Drive each operation for real and validate what it answered against the document."""
    org = admin.organization_id
    keys, key = (
        "/v1/organizations/{organizationId}/keys",
        "/v1/organizations/{organizationId}/keys/{keyId}",
    )
    roles = "/v1/organizations/{organizationId}/roles"
    role = roles + "/{roleId}"
    seen: list[tuple[str, str, int]] = []

    async def check(path: str, method: str, response: Any) -> Any:
        body = await response.json()
        errors = sorted(
            _validator(document, path, method, response.status).iter_errors(body), key=str
        )
        assert not errors, f"{method} {path} {response.status}: {errors[0].message}"
        seen.append((path, method, response.status))
        return body

    h = admin.headers
    made = await check(keys, "post", await client.post(f"/v1/organizations/{org}/keys",
                       json={"name": "doc", "roles": ["developer"]}, headers=h))  # fmt: skip
    kid = made["result"]["key"]["id"]
    own = {"name": "own", "roles": ["developer"], "hashData": hash_data("doc-own-key", "s")}
    await check(
        keys, "post", await client.post(f"/v1/organizations/{org}/keys", json=own, headers=h)
    )
    await check(keys, "get", await client.get(f"/v1/organizations/{org}/keys?limit=1", headers=h))
    await check(key, "get", await client.get(f"/v1/organizations/{org}/keys/{kid}", headers=h))
    await check(key, "patch", await client.patch(f"/v1/organizations/{org}/keys/{kid}",
                json={"expireAt": "2099-01-01T00:00:00Z"}, headers=h))  # fmt: skip
    await check(key, "patch", await client.patch(f"/v1/organizations/{org}/keys/{kid}",
                json={"name": "x"}, headers={**h, "If-Match": '"stale"'}))  # fmt: skip
    created = await check(roles, "post", await client.post(f"/v1/organizations/{org}/roles",
                          json={"name": "r", "permissions": ["keys:read"]}, headers=h))  # fmt: skip
    rid = created["result"]["id"]
    await check(roles, "get", await client.get(f"/v1/organizations/{org}/roles", headers=h))
    await check(role, "get", await client.get(f"/v1/organizations/{org}/roles/{rid}", headers=h))
    await check(role, "patch", await client.patch(f"/v1/organizations/{org}/roles/{rid}",
                json={"name": "r2"}, headers=h))  # fmt: skip
    await check(
        role, "delete", await client.delete(f"/v1/organizations/{org}/roles/{rid}", headers=h)
    )
    stale = await client.delete(
        f"/v1/organizations/{org}/keys/{kid}", headers={**h, "If-Match": '"stale"'}
    )
    assert (await check(key, "delete", stale))["status"] == 412
    await check(
        key, "delete", await client.delete(f"/v1/organizations/{org}/keys/{kid}", headers=h)
    )
    await check(key, "get", await client.get(f"/v1/organizations/{org}/keys/{kid}", headers=h))
    await check(key, "get", await client.get(f"/v1/organizations/{org}/keys/{kid}"))
    await check(
        keys,
        "post",
        await client.post(f"/v1/organizations/{org}/keys", json={"name": ""}, headers=h),
    )
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    await check(keys, "post", await client.post(f"/v1/organizations/{org}/keys",
                json={"name": "n", "roles": ["admin"]}, headers=dev.headers))  # fmt: skip
    activities = "/v1/organizations/{organizationId}/activities"
    log = await check(activities, "get", await client.get(
        f"/v1/organizations/{org}/activities?limit=250&include=keysvc", headers=h))  # fmt: skip
    assert {a["type"] for a in log["result"]} >= {"key_create", "role_update", "key_delete"}
    for entry in log["result"]:
        await check(activities + "/{activityId}", "get", await client.get(
            f"/v1/organizations/{org}/activities/{entry['id']}", headers=h))  # fmt: skip
    up_doc = upstream()
    activity = {**up_doc["components"]["schemas"]["Activity"], "components": up_doc["components"]}
    for entry in log["result"]:  # upstream's own schema takes keysvc's activities too
        upstream_fields = {k: v for k, v in entry.items() if k in activity["properties"]}
        if entry["type"] in activity["properties"]["type"]["enum"]:
            assert not list(Draft202012Validator(activity).iter_errors(upstream_fields))
    await check("/v1/whoami", "get", await client.get("/v1/whoami", headers=h))
    await check("/healthz", "get", await client.get("/healthz"))
    await check("/readyz", "get", await client.get("/readyz"))
    statuses = {status for _, _, status in seen}
    assert statuses == {200, 400, 401, 403, 404, 412}
    await create(client, admin, {"name": "still works", "roles": ["developer"]})


async def test_docs_page_works_offline(client: Client) -> None:
    page = await client.get("/docs")
    assert page.status == 200 and page.content_type == "text/html"
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    html = await page.text()
    assert not re.search(r"(src|href)=\"(https?:)?//", html), "the page must load nothing remote"
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert {"docs/assets/swagger-ui-bundle.js", "docs/assets/docs.js"} <= set(assets)
    for asset in assets:
        response = await client.get("/" + asset)
        assert response.status == 200, asset
        assert len(await response.read()) > 0
    script = await (await client.get("/docs/assets/docs.js")).text()
    assert 'url: "v1/openapi.json"' in script
    missing = await client.get("/docs/assets/..%2Fcore.py")
    assert missing.status == 404
