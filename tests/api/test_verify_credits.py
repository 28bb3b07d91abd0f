"""Issue 29 on /v1/verify, through the real app on both backends: a key with credits
spends the request's cost once every other check has passed; not enough is a 429
counted in usage as creditsExhausted; such answers are never reusable by a proxy;
verify names the externalId and answers JSON when asked."""

from datetime import datetime, timedelta
from typing import Any

import pytest

from keysvc.config import Settings
from tests.api.usage import NOTHING, clock_at_moment, totals
from tests.helpers import (
    Client,
    ClientFactory,
    Creds,
    FakeClock,
    assert_error,
    assert_ok,
    bootstrap,
    client_with,
    create_creds,
    create_role,
    get_key,
    keys_url,
)

VERIFY = "/v1/verify"
BAD_COST = "cost: must be an integer from 0 to 1000000"


async def _metered(client: Client, admin: Creds, credits: Any, **extra: Any) -> Creds:
    body = {"name": "metered", "roles": ["developer"], "credits": credits, **extra}
    return await create_creds(client, admin, body)


async def _remaining(client: Client, admin: Creds, key_id: str) -> int:
    remaining: int = (await get_key(client, admin, key_id))["credits"]["remaining"]
    return remaining


async def test_each_verify_spends_one_until_none_remain(client: Client, admin: Creds) -> None:
    key = await _metered(client, admin, {"remaining": 3})
    for left in (2, 1, 0):
        response = await client.get(VERIFY, headers=key.headers)
        assert response.status == 200
        assert response.headers["X-Credits-Remaining"] == str(left)
        assert response.headers["Cache-Control"] == "no-store"
        assert response.headers["X-Accel-Expires"] == "0"
    refused = await client.get(VERIFY, headers=key.headers)
    body = await assert_error(
        refused, 429, "credits exhausted for this key: 0 remaining; no refill is due"
    )
    assert body["status"] == 429
    assert "Retry-After" not in refused.headers
    assert refused.headers["Cache-Control"] == "no-store"
    assert refused.headers["X-Accel-Expires"] == "0"
    assert await _remaining(client, admin, key.id) == 0


async def test_a_key_without_credits_answers_as_before(client: Client, admin: Creds) -> None:
    key = await create_creds(client, admin, {"name": "plain", "roles": ["developer"]})
    response = await client.get(VERIFY, headers=key.headers)
    assert response.status == 200
    for header in ("X-Credits-Remaining", "X-Key-External-Id"):
        assert header not in response.headers
    # Reusable for the default bound, as any key's without credits or a request limit.
    assert response.headers["Cache-Control"] == "private, max-age=1"
    assert response.headers["X-Accel-Expires"].startswith("@")
    assert await response.read() == b""


async def test_the_cost_header_and_parameter(client: Client, admin: Creds) -> None:
    key = await _metered(client, admin, {"remaining": 10})
    response = await client.get(VERIFY, headers={**key.headers, "X-Credit-Cost": "4"})
    assert response.headers["X-Credits-Remaining"] == "6"
    response = await client.get(VERIFY + "?cost=5", headers=key.headers)
    assert response.headers["X-Credits-Remaining"] == "1"
    response = await client.get(VERIFY + "?cost=0", headers=key.headers)
    assert (response.status, response.headers["X-Credits-Remaining"]) == (200, "1")
    refused = await client.get(VERIFY + "?cost=2", headers=key.headers)
    await assert_error(
        refused, 429, "credits exhausted for this key: 1 remaining; no refill is due"
    )
    assert await _remaining(client, admin, key.id) == 1  # a refusal spends nothing


@pytest.mark.parametrize(
    "cost", ["-1", "1.5", "x", "1000001", "99999999999999999999", "\u0661", "", " 1"]
)
async def test_a_malformed_cost_is_a_400(client: Client, admin: Creds, cost: str) -> None:
    key = await _metered(client, admin, {"remaining": 10})
    response = await client.get(VERIFY, params={"cost": cost}, headers=key.headers)
    await assert_error(response, 400, BAD_COST)
    assert await _remaining(client, admin, key.id) == 10


async def test_cost_given_both_ways_is_the_larger(client: Client, admin: Creds) -> None:
    key = await _metered(client, admin, {"remaining": 10})
    # A client's header cannot lower the cost a proxy names in the query, nor the reverse.
    response = await client.get(VERIFY + "?cost=4", headers={**key.headers, "X-Credit-Cost": "0"})
    assert response.headers["X-Credits-Remaining"] == "6"
    response = await client.get(VERIFY + "?cost=0", headers={**key.headers, "X-Credit-Cost": "3"})
    assert response.headers["X-Credits-Remaining"] == "3"
    twice = await client.get(VERIFY + "?cost=1&cost=1", headers=key.headers)
    await assert_error(twice, 400, "cost: give it once, in X-Credit-Cost or ?cost=")
    ok = await client.get(VERIFY + "?cost=1000000", headers=key.headers)
    assert ok.status == 429  # the largest cost is well-formed


async def test_nothing_is_spent_before_every_other_check_passes(
    client: Client, admin: Creds, other_admin: Creds
) -> None:
    key = await _metered(client, admin, {"remaining": 5})
    forbidden = await client.get(
        VERIFY, headers={**key.headers, "X-Required-Permission": "reports:write"}
    )
    assert forbidden.status == 403
    elsewhere = await client.get(
        VERIFY, headers={**key.headers, "X-Required-Organization": other_admin.organization_id}
    )
    assert elsewhere.status == 403
    ip_bound = await _metered(
        client, admin, {"remaining": 5}, ipAccessList=[{"source": "192.0.2.1"}]
    )
    assert (await client.get(VERIFY, headers=ip_bound.headers)).status == 403
    assert await _remaining(client, admin, key.id) == 5
    assert await _remaining(client, admin, ip_bound.id) == 5


async def test_a_rate_limited_verify_spends_nothing(client: Client, admin: Creds) -> None:
    key = await _metered(
        client, admin, {"remaining": 50}, rateLimit={"limit": 2, "windowSeconds": 3600}
    )
    statuses = [(await client.get(VERIFY, headers=key.headers)).status for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    assert await _remaining(client, admin, key.id) == 48


async def test_the_management_api_spends_nothing(client: Client, admin: Creds) -> None:
    role = await create_role(client, admin, {"name": "r", "permissions": ["keys:read"]})
    body = {"name": "reader", "assignedRoleIds": [role["id"]], "credits": {"remaining": 2}}
    key = await create_creds(client, admin, body)
    for _ in range(3):
        await assert_ok(await client.get(keys_url(key), headers=key.headers))
    assert await _remaining(client, admin, key.id) == 2


async def test_retry_after_is_the_time_to_the_next_refill(
    client: Client, admin: Creds, clock: FakeClock
) -> None:
    key = await _metered(
        client, admin, {"remaining": 1, "refill": {"interval": "daily", "amount": 2}}
    )
    assert (await client.get(VERIFY, headers=key.headers)).status == 200
    got = await assert_ok(await client.get(keys_url(admin, key.id), headers=admin.headers))
    midnight = datetime.fromisoformat(got["credits"]["nextRefillAt"])
    clock.now = midnight - timedelta(seconds=90)
    refused = await client.get(VERIFY, headers=key.headers)
    await assert_error(
        refused, 429, "credits exhausted for this key: 0 remaining; next refill in 90 s"
    )
    assert refused.headers["Retry-After"] == "90"
    clock.now = midnight
    response = await client.get(VERIFY, headers=key.headers)
    assert (response.status, response.headers["X-Credits-Remaining"]) == (200, "1")


async def test_refusals_count_in_usage_as_their_own_outcome(
    aiohttp_client: ClientFactory, settings: Settings
) -> None:
    client = await client_with(aiohttp_client, settings, clock_at_moment())
    admin = await bootstrap(client.app)
    key = await _metered(client, admin, {"remaining": 1})
    for _ in range(3):
        await client.get(VERIFY, headers=key.headers)
    assert await totals(client, admin, key.id) == {**NOTHING, "success": 1, "creditsExhausted": 2}


async def test_verify_names_the_external_id(client: Client, admin: Creds) -> None:
    key = await create_creds(
        client, admin, {"name": "t", "roles": ["developer"], "externalId": "cust_42"}
    )
    response = await client.get(VERIFY, headers=key.headers)
    assert response.headers["X-Key-External-Id"] == "cust_42"
    assert response.headers["X-Key-Id"] == key.id


async def test_verify_answers_json_when_asked(client: Client, admin: Creds) -> None:
    key = await _metered(
        client,
        admin,
        {"remaining": 4},
        externalId="cust_1",
        meta={"plan": "pro"},
        rateLimit={"limit": 10, "windowSeconds": 60},
    )
    response = await client.post(
        VERIFY, headers={**key.headers, "Accept": "application/json", "X-Credit-Cost": "3"}
    )
    result = await assert_ok(response)
    assert result == {
        "keyId": key.id,
        "organizationId": admin.organization_id,
        "name": "metered",
        "externalId": "cust_1",
        "meta": {"plan": "pro"},
        "permissions": ["keys:read", "roles:read"],
        "credits": {"remaining": 1},
        "ratelimit": {"limit": 10, "remaining": 9, "reset": result["ratelimit"]["reset"]},
        # Issue 36: the identity its externalId made.
        "identity": {"id": result["identity"]["id"], "externalId": "cust_1", "meta": None},
    }
    assert 1 <= result["ratelimit"]["reset"] <= 60
    assert response.headers["X-Credits-Remaining"] == "1"
    assert response.headers["Cache-Control"] == "no-store"
    plain = await create_creds(client, admin, {"name": "p", "roles": ["developer"]})
    response = await client.get(VERIFY, headers={**plain.headers, "Accept": "application/json"})
    assert await assert_ok(response) == {
        "keyId": plain.id,
        "organizationId": admin.organization_id,
        "name": "p",
        "externalId": None,
        "meta": None,
        "permissions": ["keys:read", "roles:read"],
    }
    # The JSON body depends on Accept, which the documented cache key does not cover.
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Accel-Expires"] == "0"


async def test_a_spend_sees_credits_changed_since_the_key_was_cached(
    client: Client, admin: Creds
) -> None:
    key = await _metered(client, admin, {"remaining": 1})
    assert (await client.get(VERIFY, headers=key.headers)).status == 200
    assert (await client.get(VERIFY, headers=key.headers)).status == 429
    url = keys_url(admin, key.id) + "/credits"
    await assert_ok(await client.post(url, json={"increment": 2}, headers=admin.headers))
    response = await client.get(VERIFY, headers=key.headers)
    assert (response.status, response.headers["X-Credits-Remaining"]) == (200, "1")
    # Unlimited now: verify spends nothing and says nothing of credits.
    await assert_ok(await client.post(url, json={"set": None}, headers=admin.headers))
    response = await client.get(VERIFY, headers=key.headers)
    assert response.status == 200 and "X-Credits-Remaining" not in response.headers
    await assert_ok(await client.post(url, json={"set": 1}, headers=admin.headers))
    assert (await client.get(VERIFY, headers=key.headers)).status == 200
    assert (await client.get(VERIFY, headers=key.headers)).status == 429
