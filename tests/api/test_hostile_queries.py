"""The hostile input corpus: path parameters, the query string and verify's
permission. Every case gets a 4xx envelope naming the problem, never a 500,
a plain-text answer or a hang."""

import json

import pytest

from tests.api.hostile import (
    BAD_CURSOR,
    BAD_LIMIT,
    UUID_RULE,
    Targets,
    assert_raw_error,
    expect_error,
    http,
    org_url,
    raw,
)
from tests.helpers import (
    Client,
    Creds,
    assert_error,
    assert_ok,
    create,
)

# Path parameters and the query string.

PATH_ENDPOINTS = {
    "list-keys": ("GET", "/v1/organizations/{org}/keys"),
    "create-key": ("POST", "/v1/organizations/{org}/keys"),
    "get-key": ("GET", "/v1/organizations/{org}/keys/{id}"),
    "patch-key": ("PATCH", "/v1/organizations/{org}/keys/{id}"),
    "delete-key": ("DELETE", "/v1/organizations/{org}/keys/{id}"),
    "list-roles": ("GET", "/v1/organizations/{org}/roles"),
    "create-role": ("POST", "/v1/organizations/{org}/roles"),
    "get-role": ("GET", "/v1/organizations/{org}/roles/{id}"),
    "patch-role": ("PATCH", "/v1/organizations/{org}/roles/{id}"),
    "delete-role": ("DELETE", "/v1/organizations/{org}/roles/{id}"),
}
BAD_UUIDS = {
    "not-a-uuid": "not-a-uuid",
    "uppercase": "0B5D3C8E-6C1A-4C59-9D8A-7A1F0E000001",
    "sql": "1' or '1'='1",
    "sql-comment": "x;--drop table api_keys",
    "no-hyphens": "0b5d3c8e6c1a4c599d8a7a1f0e000001",
    "urn": "urn:uuid:0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001",
    "trailing-space": "0b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001 ",
    "nul": "%00",
    "fullwidth-digits": "\uff10b5d3c8e-6c1a-4c59-9d8a-7a1f0e000001",
}


@pytest.mark.parametrize("value", BAD_UUIDS.values(), ids=BAD_UUIDS.keys())
async def test_bad_path_uuid_is_400(client: Client, targets: Targets, value: str) -> None:
    """Every path UUID of every endpoint, checked before anything else is done."""
    for endpoint, (method, template) in PATH_ENDPOINTS.items():
        target_id = targets.role_id if "/roles/" in template else targets.key_id
        id_name = "roleId" if "/roles/" in template else "keyId"
        urls = {"organizationId": template.format(org=value, id=target_id)}
        if "{id}" in template:
            urls[id_name] = template.format(org=targets.admin.organization_id, id=value)
        for name, url in urls.items():
            response = await client.request(method, url, json={}, headers=targets.admin.headers)
            await expect_error(response, 400, f"{name}: {UUID_RULE}", f"{endpoint} {name}")


async def test_braces_in_path_match_no_route(client: Client, targets: Targets) -> None:
    """The router takes no braces in a path segment: a 404 envelope, not a 400."""
    braced = "{" + targets.key_id + "}"
    for url in (f"/v1/organizations/{braced}/keys", org_url(targets.admin, f"/keys/{braced}")):
        response = await client.get(url, headers=targets.admin.headers)
        await assert_error(response, 404, "not found: no such endpoint")


BAD_LIMITS = {
    "zero": "0",
    "minus-one": "-1",
    "ten-to-the-12": str(10**12),
    "251": "251",
    "empty": "",
    "word": "ten",
    "float": "1.0",
    "exponent": "1e2",
    "hex": "0x10",
    "underscore": "5_0",
    "plus": "+5",
    "space": " 5",
    "arabic-indic-digit": "\u0665",
    "circled-digit": "\u2460",
    "nan": "NaN",
    "5000-digits": "9" * 5000,
    "sql": "1; drop table api_keys",
}


@pytest.mark.parametrize("limit", BAD_LIMITS.values(), ids=BAD_LIMITS.keys())
async def test_bad_limit_is_400(client: Client, admin: Creds, limit: str) -> None:
    response = await client.get(
        org_url(admin, "/keys"), params={"limit": limit}, headers=admin.headers
    )
    await assert_error(response, 400, BAD_LIMIT)


@pytest.mark.parametrize("limit", ["1", "250", "007"])
async def test_limit_bounds_are_accepted(client: Client, admin: Creds, limit: str) -> None:
    response = await client.get(
        org_url(admin, "/keys"), params={"limit": limit}, headers=admin.headers
    )
    assert len(await assert_ok(response)) == 1


async def test_query_parameter_twice_or_unknown(client: Client, admin: Creds) -> None:
    twice = await client.get(org_url(admin, "/keys?limit=1&limit=2"), headers=admin.headers)
    await assert_error(twice, 400, "limit: given more than once")
    unknown = await client.get(org_url(admin, "/keys?limit=1&id=1"), headers=admin.headers)
    await assert_error(unknown, 400, "id: is not a known field")


BAD_CURSORS = {
    "empty": "",
    "word": "garbage",
    "sql": "1' or '1'='1",
    "no-signature": "1.",
    "no-position": ".abc",
    "superscript-digit": "\u00b2.abc",
    "arabic-indic-digit": "\u0663.abc",
    "negative": "-1.abc",
    "19-digits": "9" * 19 + ".abc",
    "extra-dot": "1.abc.def",
    "forged-signature": "1.AAAAAAAAAAAAAAAAAAAAAA",
    "nul": "1.\x00",
    "huge": "1." + "A" * 10_000,
}


@pytest.mark.parametrize("cursor", BAD_CURSORS.values(), ids=BAD_CURSORS.keys())
async def test_bad_cursor_is_400(client: Client, admin: Creds, cursor: str) -> None:
    response = await client.get(
        org_url(admin, "/keys"), params={"cursor": cursor}, headers=admin.headers
    )
    await assert_error(response, 400, BAD_CURSOR)


async def test_non_utf8_query_is_400(client: Client, admin: Creds) -> None:
    for query in ("cursor=%FF%FE", "limit=%FF", "%FF=1"):
        request = http(
            "GET",
            org_url(admin, f"/keys?{query}"),
            [("Authorization", admin.headers["Authorization"])],
        )
        assert_raw_error(await raw(client, request), 400)


async def test_foreign_cursor_is_400(client: Client, admin: Creds, other_admin: Creds) -> None:
    await create(client, other_admin, {"name": "second", "roles": ["developer"]})
    page = await client.get(
        org_url(other_admin, "/keys"), params={"limit": "1"}, headers=other_admin.headers
    )
    cursor = (await page.json())["nextCursor"]
    assert cursor
    response = await client.get(
        org_url(admin, "/keys"), params={"cursor": cursor}, headers=admin.headers
    )
    await assert_error(response, 400, BAD_CURSOR)


BAD_PERMISSIONS = {
    "uppercase": "REPORTS:READ",
    "sql": "' or 1=1 --",
    "no-action": "reports",
    "too-long": "a:" + "b" * 300,
    "spaces": "reports: read",
    "unicode": "r\u00e9ports:read",
    "wildcard-only-namespace": "*:read",
}
# Several words are a permission query (keysvc.domain.permquery): its first bad word is named.
MESSAGES = {
    "' or 1=1 --": 'permission: "\'" at character 1 must be namespace:action, such as reports:read',
    "reports: read": "permission: 'reports:' at character 1 must be namespace:action,"
    " such as reports:read",
}


@pytest.mark.parametrize("permission", BAD_PERMISSIONS.values(), ids=BAD_PERMISSIONS.keys())
async def test_verify_bad_permission_is_400(client: Client, admin: Creds, permission: str) -> None:
    message = MESSAGES.get(permission, "permission: must be namespace:action, such as reports:read")
    in_header = {**admin.headers, "X-Required-Permission": permission}
    response = await client.get("/v1/verify", headers=in_header)
    await expect_error(response, 400, message, "X-Required-Permission")
    in_query = {"permission": permission}
    response = await client.get("/v1/verify", params=in_query, headers=admin.headers)
    await expect_error(response, 400, message, "?permission=")


async def test_verify_non_utf8_permission_header_is_400(client: Client, admin: Creds) -> None:
    request = http(
        "GET",
        "/v1/verify",
        [
            ("Authorization", admin.headers["Authorization"]),
            ("X-Required-Permission", b"reports:r\xe9ad"),
        ],
    )
    assert_raw_error(
        await raw(client, request),
        400,
        "permission: must be namespace:action, such as reports:read",
    )


async def test_garbage_forwarded_for_is_ignored_not_a_500(client: Client, admin: Creds) -> None:
    """X-Forwarded-For from an untrusted peer is never read: garbage there changes nothing."""
    request = http(
        "GET",
        "/v1/whoami",
        [
            ("Authorization", admin.headers["Authorization"]),
            ("X-Forwarded-For", b"\xff, fe80::1%eth0, 1' or '1'='1, " + b"9" * 5000),
        ],
    )
    answer = await raw(client, request)
    assert answer.status == 200
    assert json.loads(answer.body)["result"]["id"] == admin.id
