"""The activity list's dates are parsed strictly: a NUL (which ends the text for
``datetime.fromisoformat``) or anything else but printable ASCII after a valid date is
a 400 envelope, never a filter on the part before it."""

import pytest

from tests.helpers import Client, Creds, assert_error, assert_ok

EXAMPLE = "must be an ISO-8601 date-time such as 2026-01-02T03:04:05Z"


def url(creds: Creds, query: str) -> str:
    return f"/v1/organizations/{creds.organization_id}/activities?{query}"


@pytest.mark.parametrize("field", ["from_date", "to_date"])
@pytest.mark.parametrize(
    "tail",
    ["%00garbage", "%00", "%0A", "%C2%A0", "%D9%A0"],  # NUL, newline, nbsp, Arabic 0
)
async def test_a_date_with_a_tail_is_refused(
    client: Client, admin: Creds, field: str, tail: str
) -> None:
    response = await client.get(
        url(admin, f"{field}=2026-01-02T03:04:05Z{tail}"), headers=admin.headers
    )
    await assert_error(response, 400, f"{field}: {EXAMPLE}")


async def test_a_plain_date_is_still_taken(client: Client, admin: Creds) -> None:
    response = await client.get(
        url(admin, "from_date=2000-01-02T03:04:05Z&to_date=2999-01-02T03:04:05%2B02:00"),
        headers=admin.headers,
    )
    assert len(await assert_ok(response)) >= 1


async def test_an_expiry_with_a_nul_is_refused_too(client: Client, admin: Creds) -> None:
    body = {"name": "x", "roles": ["developer"], "expireAt": "2030-01-01T00:00:00Z\u0000x"}
    response = await client.post(
        f"/v1/organizations/{admin.organization_id}/keys", json=body, headers=admin.headers
    )
    await assert_error(
        response, 400, "expireAt: must be an ISO-8601 date-time such as 2030-01-01T00:00:00Z"
    )
