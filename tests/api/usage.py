"""What the usage tests (tests/api/test_usage*.py) share: a fixed moment inside a
minute, the outcomes answered, and reading a key's series."""

from datetime import UTC, datetime
from typing import Any

from keysvc.http.state import STORE
from tests.helpers import Client, Creds, FakeClock, assert_ok

# Inside a minute, so that rounding to whole buckets shows.
MOMENT = datetime(2026, 3, 4, 5, 6, 30, tzinfo=UTC)
OUTCOMES = (
    "success", "disabled", "expired", "ipDenied", "forbidden", "rateLimited", "creditsExhausted"
)  # fmt: skip
NOTHING = dict.fromkeys(OUTCOMES, 0)


def clock_at_moment() -> FakeClock:
    clock = FakeClock()
    clock.now = MOMENT
    return clock


def usage_url(creds: Creds, key_id: str) -> str:
    return f"/v1/organizations/{creds.organization_id}/keys/{key_id}/usage"


async def written(client: Client) -> None:
    """This app's counts written now, rather than at its next flush."""
    await client.app[STORE].write_usage()


async def usage(client: Client, caller: Creds, key_id: str, **params: str) -> dict[str, Any]:
    response = await client.get(usage_url(caller, key_id), params=params, headers=caller.headers)
    result: dict[str, Any] = await assert_ok(response)
    return result


async def totals(client: Client, caller: Creds, key_id: str) -> dict[str, int]:
    """The key's counts over the day of MOMENT, by outcome."""
    await written(client)
    day = {"from": "2026-03-04T00:00:00Z", "to": "2026-03-05T00:00:00Z", "granularity": "day"}
    result = await usage(client, caller, key_id, **day)
    (bucket,) = result["series"]
    assert bucket["start"] == "2026-03-04T00:00:00Z"
    return {name: bucket[name] for name in OUTCOMES}
