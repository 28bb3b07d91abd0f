"""Forward-auth verification: /v1/verify answers proxies with headers or an envelope."""

import ipaddress
from typing import Any

import pytest
from multidict import CIMultiDict

from keysvc.config import Settings
from tests.helpers import (
    UNAUTHORIZED,
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    basic,
    bootstrap,
    client_with,
    create_creds,
    create_role,
)

MALFORMED = "permission: must be namespace:action, such as reports:read"
TWICE = "permission: give it once, in X-Required-Permission or ?permission="

VERIFY = "/v1/verify"


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"])
async def test_valid_key_passes_with_headers(client: Client, admin: Creds, method: str) -> None:
    dev = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    response = await client.request(method, VERIFY, headers=dev.headers)
    assert response.status == 200
    assert await response.read() == b""
    assert response.headers["X-Key-Id"] == dev.id
    assert response.headers["X-Organization-Id"] == admin.organization_id
    assert response.headers["X-Key-Permissions"] == "keys:read,roles:read"
    assert "X-RateLimit-Limit" not in response.headers  # no limit configured


@pytest.mark.parametrize(
    ("granted", "needed", "allowed"),
    [
        (["reports:read"], "reports:read", True),
        (["reports:*"], "reports:write", True),
        (["reports:read"], "reports:write", False),
        (["keys:read"], "endpoints:query", False),
    ],
)
async def test_required_permission(
    client: Client, admin: Creds, granted: list[str], needed: str, allowed: bool
) -> None:
    role = await assert_ok(
        await client.post(
            f"/v1/organizations/{admin.organization_id}/roles",
            json={"name": "svc", "permissions": granted},
            headers=admin.headers,
        )
    )
    key = await create_creds(client, admin, {"name": "k", "assignedRoleIds": [role["id"]]})
    for how in ({"headers": {**key.headers, "X-Required-Permission": needed}},
                {"headers": key.headers, "params": {"permission": needed}}):  # fmt: skip
        response = await client.get(VERIFY, **how)  # type: ignore[arg-type]
        if allowed:
            assert response.status == 200
        else:
            await assert_error(response, 403, f"this key lacks the permission {needed}")


async def test_admin_holds_every_downstream_permission(client: Client, admin: Creds) -> None:
    response = await client.get(VERIFY, headers={**admin.headers, "X-Required-Permission": "x:y"})
    assert response.status == 200 and response.headers["X-Key-Permissions"] == "*"


async def test_malformed_permission_is_400(client: Client, admin: Creds) -> None:
    response = await client.get(VERIFY, headers={**admin.headers, "X-Required-Permission": "NOPE"})
    await assert_error(response, 400, "permission: must be namespace:action, such as reports:read")


async def test_refusals_are_envelopes(client: Client, admin: Creds, clock: FakeClock) -> None:
    response = await client.get(VERIFY)
    await assert_error(response, 401, UNAUTHORIZED)
    assert response.headers["WWW-Authenticate"] == 'Basic realm="keysvc"'
    await assert_error(await client.get(VERIFY, headers=basic("x" * 20, "y")), 401, UNAUTHORIZED)
    off = await create_creds(
        client, admin, {"name": "off", "roles": ["admin"], "state": "disabled"}
    )
    await assert_error(await client.get(VERIFY, headers=off.headers), 401, "key is disabled")
    expiry = (clock.now.replace(microsecond=0)).isoformat()
    clock.advance(seconds=-30)
    soon = await create_creds(client, admin, {"name": "s", "roles": ["admin"], "expireAt": expiry})
    clock.advance(seconds=60)
    await assert_error(await client.get(VERIFY, headers=soon.headers), 401, "key has expired")
    fenced = await create_creds(
        client, admin, {"name": "f", "roles": ["admin"], "ipAccessList": [{"source": "10.0.0.0/8"}]}
    )
    await assert_error(
        await client.get(VERIFY, headers=fenced.headers),
        403,
        "client address not allowed for this key",
    )


async def test_verify_updates_used_at(client: Client, admin: Creds) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["query_endpoints"]})
    url = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}"
    assert "usedAt" not in await assert_ok(await client.get(url, headers=admin.headers))
    assert (await client.get(VERIFY, headers=svc.headers)).status == 200
    assert "usedAt" in await assert_ok(await client.get(url, headers=admin.headers))


async def test_key_disabled_through_the_api_is_refused_at_once(
    client: Client, admin: Creds
) -> None:
    svc = await create_creds(client, admin, {"name": "svc", "roles": ["query_endpoints"]})
    url = f"/v1/organizations/{admin.organization_id}/keys/{svc.id}"
    for _ in range(3):  # warm the cache
        assert (await client.get(VERIFY, headers=svc.headers)).status == 200
    await assert_ok(await client.patch(url, json={"state": "disabled"}, headers=admin.headers))
    await assert_error(await client.get(VERIFY, headers=svc.headers), 401, "key is disabled")


async def test_trusted_proxy_address_is_checked(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(
        aiohttp_client, settings, clock, trusted_proxies=(ipaddress.ip_network("127.0.0.1/32"),)
    )
    admin = await bootstrap(client.app)
    key = await create_creds(
        client, admin, {"name": "k", "roles": ["developer"],
                        "ipAccessList": [{"source": "198.51.100.0/24"}]}
    )  # fmt: skip
    inside = {**key.headers, "X-Forwarded-For": "198.51.100.9"}
    outside = {**key.headers, "X-Forwarded-For": "203.0.113.9"}
    assert (await client.get(VERIFY, headers=inside)).status == 200
    await assert_error(
        await client.get(VERIFY, headers=outside), 403, "client address not allowed for this key"
    )


@pytest.mark.parametrize(
    ("headers", "params", "message"),
    [
        # Both count, and a malformed value in either place is not silently ignored.
        ({"X-Required-Permission": "keys:read"}, {"permission": "nocolon"}, MALFORMED),
        ({"X-Required-Permission": "nocolon"}, {"permission": "keys:read"}, MALFORMED),
        ({}, [("permission", "keys:read"), ("permission", "x:y")], TWICE),
        ([("X-Required-Permission", "keys:read")] * 2, {}, TWICE),
    ],
)
async def test_permission_given_badly_in_either_place_is_400(
    client: Client, admin: Creds, headers: Any, params: Any, message: str
) -> None:
    sent = CIMultiDict(headers)
    sent.update(admin.headers)
    response = await client.get("/v1/verify", headers=sent, params=params)
    await assert_error(response, 400, message)


async def test_header_and_query_must_both_be_held(client: Client, admin: Creds) -> None:
    """A client header forwarded by the proxy cannot swap out the query's permission."""
    developer = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    weaker = {**developer.headers, "X-Required-Permission": "keys:read"}
    response = await client.get("/v1/verify", headers=weaker, params={"permission": "x:y"})
    await assert_error(response, 403, "this key lacks the permission x:y")
    response = await client.get("/v1/verify", headers=weaker, params={"permission": "keys:read"})
    assert response.status == 200
    stronger = {**developer.headers, "X-Required-Permission": "x:y"}
    response = await client.get("/v1/verify", headers=stronger, params={"permission": "keys:read"})
    await assert_error(response, 403, "this key lacks the permission x:y")


ORG_MALFORMED = (
    "organization: must be an organization ID, a lowercase UUID such as"
    " 123e4567-e89b-42d3-a456-426614174000"
)
ORG_TWICE = "organization: give it once, in X-Required-Organization or ?organization="
OTHER_ORG = "this key does not belong to the organization required"


async def test_required_organization_lets_only_its_keys_through(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    mine = admin.organization_id
    for how in ({"headers": {**admin.headers, "X-Required-Organization": mine}},
                {"headers": admin.headers, "params": {"organization": mine}},
                {"headers": {**admin.headers, "X-Required-Organization": mine},
                 "params": {"organization": mine}},
                {"headers": {**admin.headers, "X-Required-Organization": ""}}):  # fmt: skip
        response = await client.get(VERIFY, **how)  # type: ignore[arg-type]
        assert response.status == 200, await response.text()
        assert response.headers["X-Organization-Id"] == mine
    # An admin of another organization holds every permission, but not this organization.
    theirs = {**other_admin.headers, "X-Required-Organization": mine}
    await assert_error(await client.get(VERIFY, headers=theirs), 403, OTHER_ORG)
    response = await client.get(VERIFY, headers=other_admin.headers, params={"organization": mine})
    await assert_error(response, 403, OTHER_ORG)
    # Both count: a client header forwarded by the proxy cannot replace the query's.
    swapped = {**other_admin.headers, "X-Required-Organization": other_admin.organization_id}
    response = await client.get(VERIFY, headers=swapped, params={"organization": mine})
    await assert_error(response, 403, OTHER_ORG)
    # The organization is checked with the permission, each refused on its own.
    both = {**other_admin.headers, "X-Required-Organization": mine, "X-Required-Permission": "x:y"}
    await assert_error(await client.get(VERIFY, headers=both), 403, OTHER_ORG)
    developer = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    scoped = {**developer.headers, "X-Required-Organization": mine, "X-Required-Permission": "x:y"}
    await assert_error(
        await client.get(VERIFY, headers=scoped), 403, "this key lacks the permission x:y"
    )


@pytest.mark.parametrize(
    ("headers", "params", "message"),
    [
        ({"X-Required-Organization": "acme"}, {}, ORG_MALFORMED),
        ({}, {"organization": "0B5D3C8E-6C1A-4C59-9D8A-7A1F0E000001"}, ORG_MALFORMED),
        ({}, {"organization": ""}, ORG_MALFORMED),
        ({"X-Required-Organization": "{org}"}, {"organization": "no"}, ORG_MALFORMED),
        ([("X-Required-Organization", "{org}")] * 2, {}, ORG_TWICE),
        ({}, [("organization", "{org}"), ("organization", "{org}")], ORG_TWICE),
    ],
)
async def test_organization_given_badly_is_400(
    client: Client, admin: Creds, headers: Any, params: Any, message: str
) -> None:
    def fill(pairs: Any) -> list[tuple[str, str]]:
        items = pairs.items() if isinstance(pairs, dict) else pairs
        return [(name, value.format(org=admin.organization_id)) for name, value in items]

    sent = CIMultiDict(fill(headers))
    sent.update(admin.headers)
    response = await client.get(VERIFY, headers=sent, params=fill(params))
    await assert_error(response, 400, message)


async def test_a_long_permission_list_is_bounded_in_whole_entries(
    client: Client, admin: Creds
) -> None:
    """Forty permissions of 120 characters would be 4,839 characters of header: more than
    nginx's default 4 KiB buffer holds for keysvc's whole answer."""
    granted = sorted(f"svc{n:02d}:{'a' * 113}" for n in range(40))
    role = await create_role(client, admin, {"name": "wide", "permissions": granted})
    key = await create_creds(client, admin, {"name": "k", "assignedRoleIds": [role["id"]]})
    response = await client.get(VERIFY, headers=key.headers)
    assert response.status == 200
    header = response.headers["X-Key-Permissions"]
    assert len(header) <= 3072
    *kept, rest = header.split(",")
    assert kept == granted[: len(kept)] and len(kept) >= 20
    assert rest == f"+{len(granted) - len(kept)} more"
    # Still checked against every permission the key holds, shown or not.
    needed = {**key.headers, "X-Required-Permission": granted[-1]}
    assert (await client.get(VERIFY, headers=needed)).status == 200
