"""How long a proxy may reuse a /v1/verify answer: X-Accel-Expires (absolute, nginx's
whole-second clock) and Cache-Control on its 200 and its refusals, within
KEYSVC_VERIFY_REUSE_SECONDS, the key's expiry and its previous credentials' grace; and
no reuse at all for a key with a request limit, a 429, a 400, requirements given in the
query, or the setting at 0. Every other header and the error envelopes stay as they were."""

import ipaddress
import math
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import ClientResponse

from keysvc.config import Settings
from tests.api.rotation import rotate
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
)

VERIFY = "/v1/verify"
NO_STORE = {"X-Accel-Expires": "0", "Cache-Control": "no-store"}


def second_and(clock: FakeClock, fraction: float) -> int:
    """Put the clock ``fraction`` into a whole second; that second."""
    second = math.floor(clock.now.timestamp())
    clock.now = datetime.fromtimestamp(second + fraction, UTC)
    return second


async def assert_json(response: ClientResponse) -> Any:
    assert response.status == 200
    return await response.json()


def reuse_of(response: ClientResponse) -> dict[str, str | None]:
    return {name: response.headers.get(name) for name in NO_STORE}


def reused(last_second: int, max_age: int) -> dict[str, str | None]:
    return {"X-Accel-Expires": f"@{last_second}", "Cache-Control": f"private, max-age={max_age}"}


async def test_a_200_may_be_reused_to_the_end_of_the_second_and_keeps_its_headers(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    dev = await create_creds(client, admin, {"name": "svc", "roles": ["developer"]})
    second = second_and(clock, 0.25)
    response = await client.get(VERIFY, headers=dev.headers)
    assert response.status == 200
    # The default, 1 s: nginx's clock counts whole seconds, so the last second it may
    # serve the answer in is this one; a relative "1" would be served into the next.
    assert reuse_of(response) == reused(second, 1)
    assert response.headers["X-Key-Id"] == dev.id
    assert response.headers["X-Organization-Id"] == admin.organization_id
    assert response.headers["X-Key-Permissions"] == "keys:read,roles:read"
    assert "X-RateLimit-Limit" not in response.headers
    assert await response.read() == b""


async def test_the_setting_sets_the_bound(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=5)
    admin = await bootstrap(client.app)
    second = second_and(clock, 0.5)
    response = await client.get(VERIFY, headers=admin.headers)
    assert response.status == 200
    assert reuse_of(response) == reused(second + 4, 5)  # served in 5 whole seconds at most
    refused = await client.get(VERIFY, headers=basic("nope" * 5, "wrong"))
    await assert_error(refused, 401, UNAUTHORIZED)
    assert reuse_of(refused) == reused(second + 4, 5)


async def test_zero_turns_reuse_off_for_every_answer(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=0)
    admin = await bootstrap(client.app)
    response = await client.get(VERIFY, headers=admin.headers)
    assert response.status == 200 and response.headers["X-Key-Id"] == admin.id
    assert reuse_of(response) == NO_STORE
    refused = await client.get(VERIFY)
    await assert_error(refused, 401, UNAUTHORIZED)
    assert reuse_of(refused) == NO_STORE


async def test_refusals_may_be_reused_for_the_bound_and_stay_envelopes(
    client: Client, admin: Creds, clock: FakeClock, other_admin: Creds
) -> None:
    off = await create_creds(
        client, admin, {"name": "off", "roles": ["admin"], "state": "disabled"}
    )
    fenced = await create_creds(
        client, admin, {"name": "f", "roles": ["admin"], "ipAccessList": [{"source": "10.0.0.0/8"}]}
    )
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    second = second_and(clock, 0.9)
    missing = await client.get(VERIFY)
    await assert_error(missing, 401, UNAUTHORIZED)
    assert missing.headers["WWW-Authenticate"] == 'Basic realm="keysvc"'
    assert reuse_of(missing) == reused(second, 1)
    unknown = await client.get(VERIFY, headers=basic("x" * 20, "y"))
    await assert_error(unknown, 401, UNAUTHORIZED)
    assert reuse_of(unknown) == reused(second, 1)
    disabled = await client.get(VERIFY, headers=off.headers)
    await assert_error(disabled, 401, "key is disabled")
    assert reuse_of(disabled) == reused(second, 1)
    # The client address is in the documented cache key (X-Forwarded-For).
    outside = await client.get(VERIFY, headers=fenced.headers)
    await assert_error(outside, 403, "client address not allowed for this key")
    assert reuse_of(outside) == reused(second, 1)
    lacking = await client.get(VERIFY, headers={**dev.headers, "X-Required-Permission": "x:y"})
    await assert_error(lacking, 403, "this key lacks the permission x:y")
    assert reuse_of(lacking) == reused(second, 1)
    theirs = {**other_admin.headers, "X-Required-Organization": admin.organization_id}
    elsewhere = await client.get(VERIFY, headers=theirs)
    await assert_error(elsewhere, 403, "this key does not belong to the organization required")
    assert reuse_of(elsewhere) == reused(second, 1)


async def test_a_key_allowed_from_its_address_is_reused_as_any_other(
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
    second = second_and(clock, 0.1)
    inside = await client.get(VERIFY, headers={**key.headers, "X-Forwarded-For": "198.51.100.9"})
    assert inside.status == 200
    assert reuse_of(inside) == reused(second, 1)


async def test_a_key_with_a_request_limit_is_never_reused(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    limited = await create_creds(
        client, admin,
        {"name": "l", "roles": ["developer"], "rateLimit": {"limit": 2, "windowSeconds": 60}},
    )  # fmt: skip
    for _ in range(2):
        response = await client.get(VERIFY, headers=limited.headers)
        assert response.status == 200 and response.headers["X-RateLimit-Limit"] == "2"
        assert reuse_of(response) == NO_STORE
    over = await client.get(VERIFY, headers=limited.headers)
    body = await assert_error(over, 429, "rate limit exceeded for this key: 2 requests per 60 s;"
                              f" retry in {over.headers['Retry-After']} s")  # fmt: skip
    assert body["status"] == 429
    assert reuse_of(over) == NO_STORE


async def test_a_refusal_counted_against_a_request_limit_is_never_reused(
    client: Client, admin: Creds
) -> None:
    limited = await create_creds(
        client, admin,
        {"name": "l", "roles": ["developer"], "rateLimit": {"limit": 5, "windowSeconds": 60}},
    )  # fmt: skip
    lacking = await client.get(VERIFY, headers={**limited.headers, "X-Required-Permission": "x:y"})
    await assert_error(lacking, 403, "this key lacks the permission x:y")
    assert reuse_of(lacking) == NO_STORE


async def test_the_server_wide_request_limit_makes_every_key_seen(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, rate_limit=(100, 10))
    admin = await bootstrap(client.app)
    response = await client.get(VERIFY, headers=admin.headers)
    assert response.status == 200 and response.headers["X-RateLimit-Limit"] == "100"
    assert reuse_of(response) == NO_STORE


async def test_the_key_expiry_caps_the_bound(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=10)
    admin = await bootstrap(client.app)
    second = second_and(clock, 0.2)
    expiry = datetime.fromtimestamp(second + 3, UTC).isoformat()
    key = await create_creds(client, admin, {"name": "s", "roles": ["admin"], "expireAt": expiry})
    response = await client.get(VERIFY, headers=key.headers)
    assert response.status == 200
    assert reuse_of(response) == reused(second + 2, 2)  # never served at its expiry
    clock.now = datetime.fromtimestamp(second + 2.5, UTC)
    response = await client.get(VERIFY, headers=key.headers)
    assert response.status == 200
    assert reuse_of(response) == reused(second + 2, 0)  # to its expiry, not past it


async def test_previous_credentials_are_reused_only_within_their_grace(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, verify_reuse_seconds=30)
    admin = await bootstrap(client.app)
    old = await create_creds(client, admin, {"name": "r", "roles": ["developer"]})
    second = second_and(clock, 0.3)
    new, _ = await rotate(client, admin, old, {"gracePeriodSeconds": 5})  # until second + 5.3
    with_old = await client.get(VERIFY, headers=old.headers)
    assert with_old.status == 200 and with_old.headers["X-Key-Id"] == old.id
    assert reuse_of(with_old) == reused(second + 4, 5)
    with_new = await client.get(VERIFY, headers=new.headers)
    assert with_new.status == 200
    assert reuse_of(with_new) == reused(second + 29, 30)
    clock.now += timedelta(seconds=4.8)  # second + 5.1: no whole second left in the grace
    with_old = await client.get(VERIFY, headers=old.headers)
    assert with_old.status == 200
    assert reuse_of(with_old) == NO_STORE


async def test_a_bad_request_and_requirements_in_the_query_are_not_reused(
    client: Client, admin: Creds
) -> None:
    bad = await client.get(VERIFY, headers={**admin.headers, "X-Required-Permission": "NOPE"})
    await assert_error(bad, 400, "permission: must be namespace:action, such as reports:read")
    assert reuse_of(bad) == NO_STORE
    # The documented cache key covers headers, not the query: such answers are not reused.
    queried = await client.get(VERIFY, headers=admin.headers, params={"permission": "x:y"})
    assert queried.status == 200
    assert reuse_of(queried) == NO_STORE
    lacking = await create_creds(client, admin, {"name": "d", "roles": ["developer"]})
    refused = await client.get(VERIFY, headers=lacking.headers, params={"permission": "x:y"})
    await assert_error(refused, 403, "this key lacks the permission x:y")
    assert reuse_of(refused) == NO_STORE


async def test_failed_logins_past_the_limit_are_never_reused(
    aiohttp_client: ClientFactory, settings: Settings, clock: FakeClock
) -> None:
    client = await client_with(aiohttp_client, settings, clock, auth_failures=1)
    await bootstrap(client.app)
    await assert_error(await client.get(VERIFY, headers=basic("a" * 20, "b")), 401, UNAUTHORIZED)
    throttled = await client.get(VERIFY, headers=basic("a" * 20, "b"))
    assert throttled.status == 429
    assert (await throttled.json())["status"] == 429
    assert reuse_of(throttled) == NO_STORE


async def test_only_verify_states_a_reuse_bound(client: Client, admin: Creds) -> None:
    whoami = await client.get("/v1/whoami", headers=admin.headers)
    await assert_ok(whoami)
    assert reuse_of(whoami) == {"X-Accel-Expires": None, "Cache-Control": None}
    refused = await client.get("/v1/whoami")
    await assert_error(refused, 401, UNAUTHORIZED)
    assert refused.headers.get("X-Accel-Expires") is None


async def test_the_document_lists_the_headers_every_answer_sends(
    client: Client, admin: Creds
) -> None:
    document = await assert_json(await client.get("/v1/openapi.json"))
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    answers = {
        "200": await client.get(VERIFY, headers=admin.headers),
        "401": await client.get(VERIFY),
        "403": await client.get(VERIFY, headers={**dev.headers, "X-Required-Permission": "x:y"}),
        "400": await client.get(VERIFY, headers={**admin.headers, "X-Required-Permission": "N"}),
    }
    for method in ("get", "head", "post"):
        responses = document["paths"][VERIFY][method]["responses"]
        assert "X-Accel-Expires" not in responses["500"]["headers"]
        for status, response in answers.items():
            assert response.status == int(status)
            documented = responses[status]["headers"]
            for name in NO_STORE:
                pattern = documented[name]["schema"]["pattern"]
                assert re.fullmatch(pattern, response.headers[name]), (status, name)
