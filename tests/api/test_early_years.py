"""Dates before the year 1000 through the API: their text has a four-digit year, so
that it sorts before this millennium's and the date filters compare it right."""

from typing import Any

import pytest

from tests.helpers import Client, Creds, assert_ok, create, create_creds


async def activities(client: Client, admin: Creds, query: str) -> list[dict[str, Any]]:
    url = f"/v1/organizations/{admin.organization_id}/activities?limit=100{query}"
    result: list[dict[str, Any]] = await assert_ok(await client.get(url, headers=admin.headers))
    return result


@pytest.mark.parametrize("since", ["0999-01-01T00:00:00Z", "0001-01-01T00:00:00Z"])
async def test_an_early_from_date_keeps_every_activity(
    client: Client, admin: Creds, since: str
) -> None:
    await create(client, admin, {"name": "svc", "roles": ["developer"]})
    everything = await activities(client, admin, "")
    assert len(everything) >= 2
    assert await activities(client, admin, f"&from_date={since}") == everything
    assert await activities(client, admin, f"&to_date={since}") == []


@pytest.mark.parametrize(
    ("since", "middle", "until"),
    [
        ("0999-03-04T05:00:00Z", "0999-03-04T06:00:00Z", "0999-03-04T07:00:00Z"),
        ("0001-01-01T00:00:00Z", "0001-01-01T01:00:00Z", "0001-01-01T02:00:00Z"),
    ],
)
async def test_usage_echoes_an_early_range_with_a_four_digit_year(
    client: Client, admin: Creds, since: str, middle: str, until: str
) -> None:
    dev = await create_creds(client, admin, {"name": "dev", "roles": ["developer"]})
    url = f"/v1/organizations/{admin.organization_id}/keys/{dev.id}/usage"
    params = {"from": since, "to": until, "granularity": "hour"}
    result = await assert_ok(await client.get(url, params=params, headers=admin.headers))
    assert (result["from"], result["to"]) == (since, until)
    assert [bucket["start"] for bucket in result["series"]] == [since, middle]
    assert all(bucket["success"] == 0 for bucket in result["series"])
